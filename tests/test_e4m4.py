"""E4M4 absmax byte: exhaustive checks over all 256 codes, plus property tests."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lowbit.formats import e4m4

ALL = torch.arange(256, dtype=torch.int64).to(torch.uint8)


def test_table_matches_definition():
    for c in range(256):
        e, m = c >> 4, c & 15
        want = (m / 16) * 2.0**-14 if e == 0 else (1 + m / 16) * 2.0 ** (e - 15)
        assert e4m4.TABLE[c].item() == want
    assert e4m4.TABLE[255].item() == e4m4.MAX_VALUE
    assert e4m4.TABLE[16].item() == e4m4.MIN_NORMAL


def test_decode_strictly_increasing_and_finite():
    v = e4m4.decode(ALL)
    assert torch.isfinite(v).all()
    assert (v[1:] > v[:-1]).all()


def test_decoded_values_exact_in_half_precisions():
    v = e4m4.decode(ALL)
    assert torch.equal(v.half().float(), v)
    assert torch.equal(v.bfloat16().float(), v)


def test_encode_decode_roundtrip_all_codes():
    assert torch.equal(e4m4.encode(e4m4.decode(ALL)), ALL)


def test_worst_case_relative_error_on_normals():
    """Every gap between normal codes: its midpoint and points around it stay within 1/33."""
    lo = e4m4.TABLE[16:255].double()
    hi = e4m4.TABLE[17:256].double()
    t = torch.linspace(0, 1, 1001, dtype=torch.float64)
    v = (lo[:, None] + (hi - lo)[:, None] * t[None, :]).flatten()
    got = e4m4.decode(e4m4.encode(v)).double()
    rel = ((got - v).abs() / v).max().item()
    assert rel <= e4m4.NORMAL_REL_ERROR_BOUND + 1e-12
    # the bound is tight: the midpoint just above 2**e reaches it exactly
    mid = torch.tensor([1.0 + 1.0 / 32], dtype=torch.float64)
    err = (e4m4.decode(e4m4.encode(mid)).double() - mid).abs() / mid
    assert err.item() == pytest.approx(1 / 33, rel=1e-12)


def test_subnormal_absolute_error():
    v = torch.linspace(0, e4m4.MIN_NORMAL, 10001, dtype=torch.float64)
    got = e4m4.decode(e4m4.encode(v)).double()
    assert (got - v).abs().max().item() <= e4m4.SUBNORMAL_ABS_ERROR_BOUND


def test_ties_round_to_even():
    mids = (e4m4.TABLE[1:].double() + e4m4.TABLE[:-1].double()) / 2
    codes = e4m4.encode(mids).long()
    assert (codes % 2 == 0).all()
    lower = torch.arange(255)
    assert ((codes == lower) | (codes == lower + 1)).all()


def test_saturates_above_max():
    assert e4m4.encode(torch.tensor([2.0, 1e30])).tolist() == [255, 255]


@given(st.floats(min_value=0.0, max_value=1.9375, allow_nan=False, allow_infinity=False))
def test_encode_is_nearest(x):
    v = torch.tensor([x], dtype=torch.float64)
    code = int(e4m4.encode(v))
    dist = (e4m4.TABLE.double() - x).abs()
    assert dist[code] == dist.min()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_encode_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="finite and >= 0"):
        e4m4.encode(torch.tensor([1.0, bad]))


def test_dtype_errors():
    with pytest.raises(TypeError, match="uint8"):
        e4m4.decode(torch.zeros(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="floating point"):
        e4m4.encode(torch.zeros(3, dtype=torch.int32))
