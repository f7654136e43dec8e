"""Bit-plane packing: explicit layout check and hypothesis round trips."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lowbit.formats.kbit import pack_planes, unpack_planes


def test_layout_bit_j_of_word_b_is_bit_b_of_element_j():
    codes = torch.zeros(32, dtype=torch.uint8)
    codes[5] = 0b101  # element 5 -> bits 0 and 2
    codes[31] = 0b010  # element 31 -> bit 1 (sign bit of word 1)
    planes = pack_planes(codes, 3)
    assert planes.dtype == torch.int32 and planes.shape == (3,)
    words = [int(w) & 0xFFFFFFFF for w in planes]
    assert words == [1 << 5, 1 << 31, 1 << 5]


@st.composite
def codes_and_bits(draw):
    bits = draw(st.sampled_from([2, 3, 4, 5]))
    lead = draw(st.lists(st.integers(1, 4), min_size=0, max_size=2))
    n = 32
    for d in lead:
        n *= d
    values = draw(st.lists(st.integers(0, 2**bits - 1), min_size=n, max_size=n))
    return torch.tensor(values, dtype=torch.uint8).reshape(*lead, 32), bits


@given(codes_and_bits())
def test_pack_unpack_roundtrip(cb):
    codes, bits = cb
    planes = pack_planes(codes, bits)
    assert planes.shape == (*codes.shape[:-1], bits)
    assert torch.equal(unpack_planes(planes, bits), codes)


@given(st.integers(2, 5), st.lists(st.integers(-(2**31), 2**31 - 1), min_size=5, max_size=5))
def test_unpack_pack_roundtrip(bits, words):
    planes = torch.tensor(words[:bits], dtype=torch.int32)
    assert torch.equal(pack_planes(unpack_planes(planes, bits), bits), planes)


def test_pack_rejects_out_of_range_codes():
    with pytest.raises(ValueError, match="< 2\\*\\*bits"):
        pack_planes(torch.full((32,), 4, dtype=torch.uint8), 2)


def test_pack_rejects_bad_shape_and_dtype():
    with pytest.raises(ValueError, match="last dimension of 32"):
        pack_planes(torch.zeros(31, dtype=torch.uint8), 4)
    with pytest.raises(TypeError, match="uint8"):
        pack_planes(torch.zeros(32, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="bits must be one of"):
        unpack_planes(torch.zeros(6, dtype=torch.int32), 6)
