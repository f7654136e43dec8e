"""kbit GEMV / grouped GEMV kernels on CUDA against the format reference.

Error bound: relative norm error vs an fp64 product of the reference-dequantized weights:
fp16 <= 1e-3 and bf16 <= 8e-3 (the output's own rounding is ~2.4e-4 / ~2e-3 rms); the
default codebook is exact in fp16/bf16, so nothing else is rounded before fp32 accumulation.
"""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import lowbit
from lowbit import dispatch
from lowbit.kernels import tiled
from lowbit.kernels.tiled import counters, gemv_warps, split_max_ctas
from lowbit.kernels.library import get_library, ptr, stream_of

from .kbit_check import BOUND, DTYPES, capture
from .kbit_check import dtype_id as ids
from .kbit_check import ref as _ref
from .kbit_check import rel as _rel

pytestmark = pytest.mark.gpu


def _shapes(gen):
    yield int(torch.randint(1, 300, (1,), generator=gen)), 32 * int(torch.randint(1, 40, (1,), generator=gen))
    yield 2 * int(torch.randint(1, 200, (1,), generator=gen)) + 1, 32 * int(torch.randint(1, 12, (1,), generator=gen))
    yield 64, 8192  # 4 tiles: deep split-K
    yield 2048, 2048 + 96  # K_in not a multiple of 256 (padded group)




@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_gemv_matches_reference(bits, m, dtype, dense_path, gen):
    for n, k_in in _shapes(gen):
        q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=bits).to("cuda")
        x = torch.randn(m, k_in, generator=gen).to(dtype).cuda()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = lowbit.kbit_linear(x, q)
        assert y.shape == (m, n) and y.dtype == dtype
        err = _rel(y, _ref(x, q))
        assert err <= BOUND[dtype], f"N={n} K_in={k_in}: rel err {err:.2e}"


@pytest.mark.parametrize("pdl", [0, 1])
@pytest.mark.parametrize("bits", [2, 5])
@pytest.mark.parametrize("m", [1, 4, 6])
def test_gemv_poisoned_output_and_guard(bits, m, pdl, gen):
    """Direct C call on a NaN-filled buffer with a guard tail: every output written, nothing past it."""
    for n, k_in in ((37, 96), (1000, 4096), (64, 8192)):
        q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=bits).to("cuda")
        x = torch.randn(m, k_in, generator=gen).half().cuda()
        qw, qa = q.tiled()
        lib = get_library()
        warps = gemv_warps(lib, x.device, bits, torch.float16, m, n, k_in)
        tiles = -(-n // 16)
        buf = torch.full((m * n + 64,), float("nan"), dtype=torch.float16, device="cuda")
        ws = torch.full((warps, 2, 128), float("nan"), dtype=torch.float32, device="cuda")
        args = [ptr(x), ptr(qw), ptr(qa), ptr(q.codebook), ptr(q.scale), ptr(buf), ptr(None), ptr(ws),
                ptr(counters(x.device, tiles)),
                m, n, k_in, warps, pdl, ptr(None), stream_of(x.device)]
        lib.call("kbit_gemv", args, bits=bits, dtype=torch.float16, m=tiled.gemv_instance(m))
        torch.cuda.synchronize()
        y = buf[: m * n].view(m, n)
        assert _rel(y, _ref(x, q)) <= 1e-3
        assert buf[m * n :].isnan().all()


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
def test_streamk_every_warp_count(bits, gen):
    """Stream-K at tile-aligned warp counts (whole tiles, 2 or 4 warps per tile, one unit each) and
    unaligned ones (ranges starting and ending inside tiles, partial sums fixed up), on a
    NaN-filled output with a guard tail; the last group of each row is partial (K_in % 256)."""
    n, k_in = 16 * 24 - 5, 256 * 8 - 96  # 24 tiles x 8 groups = 192 units
    q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=bits).to("cuda")
    qw, qa = q.tiled()
    lib = get_library()
    for m in (1, 3, 7):
        x = torch.randn(m, k_in, generator=gen).half().cuda()
        ref = _ref(x, q)
        for warps in (24, 48, 96, 192, 37, 5, 1):
            buf = torch.full((m * n + 64,), float("nan"), dtype=torch.float16, device="cuda")
            ws = torch.full((warps, 2, 128), float("nan"), dtype=torch.float32, device="cuda")
            args = [ptr(x), ptr(qw), ptr(qa), ptr(q.codebook), ptr(q.scale), ptr(buf), ptr(None), ptr(ws),
                    ptr(counters(x.device, 24)), m, n, k_in, warps, 0, ptr(None), stream_of(x.device)]
            lib.call("kbit_gemv", args, bits=bits, dtype=torch.float16, m=tiled.gemv_instance(m))
            torch.cuda.synchronize()
            err = _rel(buf[: m * n].view(m, n), ref)
            assert err <= 1e-3, f"warps={warps} m={m}: rel err {err:.2e}"
            assert buf[m * n :].isnan().all()


@pytest.mark.parametrize("pdl", [0, 1])
@pytest.mark.parametrize("bits", [2, 3, 4, 5])
def test_local_gemv_every_grid(bits, pdl, gen):
    """Stream-K's CTA-local mode (each CTA owns whole tiles, its 16 warps share them, partial tiles
    summed in shared memory): grids from one CTA to one per tile, so CTAs own 1..all tiles, warps
    own less than a unit's share (empty ranges), parts of one tile, or several tiles; NaN-filled
    output with a guard tail, K_in % 256 != 0, and bit-equal results on a repeat."""
    lib = get_library()
    for n, k_in in ((16 * 37 - 5, 256 * 5 - 96), (16 * 3, 256 * 40), (16 * 300 + 3, 256 * 4 + 32)):
        q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=bits).to("cuda")
        qw, qa = q.tiled()
        tiles = -(-n // 16)
        for m in (1, 8):
            x = torch.randn(m, k_in, generator=gen).half().cuda()
            ref = _ref(x, q)
            one_wave = tiled.local_ctas(lib, x.device, bits, torch.float16, m, n)
            for ctas in sorted({min(tiles, c) for c in (1, 7, tiles, one_wave)}):
                outs = []
                for _ in range(2):
                    buf = torch.full((m * n + 64,), float("nan"), dtype=torch.float16, device="cuda")
                    args = [ptr(x), ptr(qw), ptr(qa), ptr(q.codebook), ptr(q.scale), ptr(buf), ptr(None), ptr(None),
                            ptr(None), m, n, k_in, tiled.STREAM_CTA_WARPS * ctas, pdl | tiled.FLAG_LOCAL,
                            ptr(None), stream_of(x.device)]
                    lib.call("kbit_gemv", args, bits=bits, dtype=torch.float16, m=tiled.gemv_instance(m))
                    torch.cuda.synchronize()
                    assert buf[m * n :].isnan().all()
                    outs.append(buf[: m * n].view(m, n))
                err = _rel(outs[0], ref)
                assert err <= 1e-3, f"N={n} K_in={k_in} m={m} ctas={ctas}: rel err {err:.2e}"
                assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("local", [0, 1])
@pytest.mark.parametrize("bits", [2, 3])
def test_streamk_shared_x_equals_global_x(bits, local, gen):
    """K <= 3: the stream-K kernel copies x to shared memory (zero-padded to whole groups) when the copy fits
    (<= 32 KB); the same call reading x from global memory (FLAG_GLOBAL_X) is bit-equal, on both modes,
    K_in % 256 != 0, 1..8 tokens (8 x 8192 does not fit: both read global), NaN-filled outputs."""
    lib = get_library()
    for n, k_in in ((16 * 37 - 5, 256 * 5 - 96), (300, 8192), (16 * 200, 2048 + 32)):
        q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=bits).to("cuda")
        qw, qa = q.tiled()
        tiles = -(-n // 16)
        for m in (1, 3, 8):
            x = torch.randn(m, k_in, generator=gen).half().cuda()
            outs = []
            for extra in (0, tiled.FLAG_GLOBAL_X):
                buf = torch.full((m * n + 64,), float("nan"), dtype=torch.float16, device="cuda")
                if local:
                    warps = tiled.STREAM_CTA_WARPS * min(tiles, tiled.local_ctas(lib, x.device, bits, torch.float16, m, n))
                    ws, cnt, flags = None, None, tiled.FLAG_LOCAL | extra
                else:
                    warps = gemv_warps(lib, x.device, bits, torch.float16, m, n, k_in)
                    ws = torch.empty((warps, 2, 128), dtype=torch.float32, device="cuda")
                    cnt, flags = counters(x.device, tiles), extra
                args = [ptr(x), ptr(qw), ptr(qa), ptr(q.codebook), ptr(q.scale), ptr(buf), ptr(None), ptr(ws), ptr(cnt),
                        m, n, k_in, warps, flags, ptr(None), stream_of(x.device)]
                lib.call("kbit_gemv", args, bits=bits, dtype=torch.float16, m=tiled.gemv_instance(m))
                torch.cuda.synchronize()
                assert buf[m * n :].isnan().all()
                outs.append(buf[: m * n].view(m, n))
            assert _rel(outs[0], _ref(x, q)) <= 1e-3, f"N={n} K_in={k_in} m={m}"
            assert torch.equal(outs[0], outs[1]), f"N={n} K_in={k_in} m={m}: shared x != global x"


def test_local_gemv_rejects_bad_grids(gen):
    """CTA-local mode: warp counts that are not whole 16-warp CTAs, or more CTAs than tiles, are refused."""
    lib = get_library()
    n, k_in = 64, 512
    q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=4).to("cuda")
    qw, qa = q.tiled()
    x = torch.randn(1, k_in, generator=gen).half().cuda()
    y = torch.empty(1, n, dtype=torch.float16, device="cuda")
    for warps in (15, 24, 16 * 5):
        args = [ptr(x), ptr(qw), ptr(qa), ptr(q.codebook), ptr(q.scale), ptr(y), ptr(None), ptr(None), ptr(None),
                1, n, k_in, warps, tiled.FLAG_LOCAL, ptr(None), stream_of(x.device)]
        with pytest.raises(RuntimeError):
            lib.call("kbit_gemv", args, bits=4, dtype=torch.float16, m=1)


@pytest.mark.parametrize("pdl", [0, 1])
@pytest.mark.parametrize("bits", [2, 5])
@pytest.mark.parametrize("m", [1, 4])
def test_split_gemv_poisoned_output_and_guard(bits, m, pdl, gen):
    """Split-K-in-CTA kernel, direct C call, NaN-filled output with a guard tail; also a shape with
    more CTA items than one wave (grid-stride over items)."""
    lib = get_library()
    for n, k_in in ((37, 96), (1000, 4096), (64, 8192), (40000 + 5, 64)):
        q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=bits).to("cuda")
        x = torch.randn(m, k_in, generator=gen).half().cuda()
        qw, qa = q.tiled()
        buf = torch.full((m * n + 64,), float("nan"), dtype=torch.float16, device="cuda")
        max_ctas = split_max_ctas(lib, x.device, bits, torch.float16, 1)
        args = [ptr(x), ptr(None), m, ptr(qw), ptr(qa), ptr(q.codebook), ptr(q.scale), ptr(buf), ptr(None), 1, n, k_in,
                max_ctas, pdl, ptr(None), stream_of(x.device)]
        lib.call("kbit_split_gemv", args, bits=bits, dtype=torch.float16)
        torch.cuda.synchronize()
        assert _rel(buf[: m * n].view(m, n), _ref(x, q)) <= 1e-3, f"N={n} K_in={k_in}"
        assert buf[m * n :].isnan().all()
        if n > 40000:
            assert tiled.split_items(n, k_in) > max_ctas


@pytest.mark.parametrize("bits", [3, 4])
@pytest.mark.parametrize("m", [1, 3])
def test_split_every_group_count(bits, m, gen):
    """1..9 groups per row: split = min(groups, 8) warps per tile, so 3, 5, 6 and 7 leave warps of the CTA
    idle (they must not write, and must still reach every barrier). Random odd N; poisoned output + guard."""
    lib = get_library()
    for groups in range(1, 10):
        k_in = 256 * groups - 32 * int(torch.randint(0, 8, (1,), generator=gen))
        n = 2 * int(torch.randint(1, 400, (1,), generator=gen)) + 1
        q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=bits).to("cuda")
        x = torch.randn(m, k_in, generator=gen).half().cuda()
        qw, qa = q.tiled()
        buf = torch.full((m * n + 64,), float("nan"), dtype=torch.float16, device="cuda")
        for max_ctas in (split_max_ctas(lib, x.device, bits, torch.float16, 1), 3):  # one wave; grid-stride
            buf[: m * n].fill_(float("nan"))
            args = [ptr(x), ptr(None), m, ptr(qw), ptr(qa), ptr(q.codebook), ptr(q.scale), ptr(buf), ptr(None), 1, n,
                    k_in, max_ctas, 0, ptr(None), stream_of(x.device)]
            lib.call("kbit_split_gemv", args, bits=bits, dtype=torch.float16)
            torch.cuda.synchronize()
            assert _rel(buf[: m * n].view(m, n), _ref(x, q)) <= 1e-3, f"N={n} K_in={k_in} ctas={max_ctas}"
            assert buf[m * n :].isnan().all()


@pytest.mark.parametrize("bits", [2, 5])
@pytest.mark.parametrize("m", [1, 4])
def test_gemv_long_k(bits, m, dense_path, gen):
    """Long rows (K_in = 16416: 65 groups, last one partial) on few tiles: deep split-K."""
    n, k_in = 80, 16384 + 32
    q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=bits).to("cuda")
    x = torch.randn(m, k_in, generator=gen).half().cuda()
    assert _rel(lowbit.kbit_linear(x, q), _ref(x, q)) <= 1e-3


def test_gemv_misaligned_x(gen):
    """A contiguous x view at an 8-byte offset (not 16-byte aligned) still gives the right answer."""
    q = lowbit.quantize_kbit(torch.randn(48, 256, generator=gen), bits=4).to("cuda")
    flat = torch.randn(2 * 256 + 4, generator=gen).half().cuda()
    x = flat[4:].view(2, 256)
    assert x.data_ptr() % 16 != 0
    assert _rel(lowbit.kbit_linear(x, q), _ref(x, q)) <= 1e-3


def test_gemv_deterministic(dense_path, gen):
    q = lowbit.quantize_kbit(torch.randn(512, 8192, generator=gen), bits=4).to("cuda")  # split-K
    x = torch.randn(3, 8192, generator=gen).half().cuda()
    assert gemv_warps(get_library(), x.device, 4, torch.float16, 3, 512, 8192) > 32 * 32 // 32  # tiles shared
    ys = [lowbit.kbit_linear(x, q) for _ in range(5)]
    assert all(torch.equal(ys[0], y) for y in ys[1:])


def _bulk_call(lib, x, q, buf, bias, n, k_in, ctas, pdl=0, m=1):
    qw, qa = q.tiled()
    args = [ptr(x), ptr(qw), ptr(qa), ptr(q.codebook), ptr(q.scale), ptr(buf), ptr(bias), m, n, k_in, ctas, pdl,
            ptr(None), stream_of(x.device)]
    lib.call("kbit_bulk_gemv", args, bits=q.bits, dtype=x.dtype)


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("pdl", [0, 1])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_bulk_gemv_poisoned_output_and_guard(bits, dtype, pdl, m, gen):
    """The bulk-copy GEMV called directly on a NaN-filled buffer with a guard tail, with and without a bias: every
    output of every token within the bound, nothing past it. Shapes: fewer groups than warps (K_in = 1024), a partial
    last slice (K_in = 5120: 20 groups), a padded last group (K_in = 2144), rows not a multiple of 16, more tiles than
    SMs, several slices of long rows (K_in = 16416)."""
    lib = get_library()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n, k_in in ((37, 1024), (1000, 5120), (300, 2144), (16 * sms * 3 + 5, 4096), (272, 16416)):
        q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=bits).to("cuda")
        x = torch.randn(m, k_in, generator=gen).to(dtype).cuda()
        ctas = min(sms, -(-n // 16))
        assert tiled.bulk_ctas(lib, x.device, bits, dtype, m, n, k_in) in ((0, ctas) if m == 1 else (0,))  # auto
        for bias in (None, torch.randn(n, generator=gen).to(dtype).cuda()):
            buf = torch.full((m * n + 64,), float("nan"), dtype=dtype, device="cuda")
            _bulk_call(lib, x, q, buf, bias, n, k_in, ctas, pdl, m=m)
            torch.cuda.synchronize()
            want = _ref(x, q) + (0 if bias is None else bias.double().cpu())
            err = _rel(buf[: m * n].view(m, n), want)
            assert err <= BOUND[dtype], f"M={m} N={n} K_in={k_in} bias={bias is not None}: rel err {err:.2e}"
            assert buf[m * n :].isnan().all()


def test_bulk_gemv_refuses_what_it_cannot_take(gen):
    """No tokens or more than 8, rotation or any flag but PDL, a bad grid, or a shape whose partial sums leave no
    room for two stages: the entry refuses (an error, nothing written), and the dispatcher never picks it there (nor
    for NVFP4, or the SwiGLU epilogue on N % 32 != 0)."""
    lib = get_library()
    q = lowbit.quantize_kbit(torch.randn(64, 512, generator=gen), bits=4).to("cuda")
    x = torch.randn(9, 512, generator=gen).half().cuda()
    buf = torch.full((9 * 64,), float("nan"), dtype=torch.float16, device="cuda")
    for m, ctas, flags in ((9, 4, 0), (0, 4, 0), (1, 4, tiled.FLAG_ROT32), (1, 5, 0), (1, 0, 0)):
        with pytest.raises(RuntimeError):
            _bulk_call(lib, x, q, buf, None, 64, 512, ctas, flags, m=m)
    torch.cuda.synchronize()
    assert buf.isnan().all()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    huge = 16 * sms * 400  # 400 tiles per CTA: 400 KB of partial sums
    dev = torch.device("cuda")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiled, "DENSE_PATH", "bulk")
        assert tiled.bulk_ctas(lib, dev, 4, torch.float16, 1, huge, 4096) == 0
        assert tiled.bulk_ctas(lib, dev, 4, torch.float16, 1, 4096, 4096) > 0
        assert tiled.bulk_ctas(lib, dev, 4, torch.float16, 8, 4096, 4096) > 0
        assert tiled.bulk_ctas(lib, dev, 4, torch.float16, 9, 4096, 4096) == 0  # 8 tokens at most
        assert tiled.bulk_ctas(lib, dev, 4, torch.float16, 8, 16 * sms * 50, 4096) == 0  # 50 tiles x 8 tokens
        assert tiled.bulk_ctas(lib, dev, 4, torch.float16, 1, 4096, 4096, swiglu=True) > 0  # tile pairs
        assert tiled.bulk_ctas(lib, dev, 4, torch.float16, 1, 4112, 4096, swiglu=True) == 0  # N % 32 != 0
        assert tiled.bulk_ctas(lib, dev, 4, torch.float16, 1, 4096, 4096, flags=tiled.FLAG_ROT32) == 0
        assert tiled.bulk_ctas(lib, dev, tiled.NVFP4, torch.float16, 1, 4096, 4096) == 0
    # auto: the decode layers' calls (an epilogue) for K in BULK_EPILOGUE_BITS, plain calls where bulk_rule says
    assert tiled.DENSE_PATH == "auto" and tiled.USE_BULK
    assert tiled.bulk_ctas(lib, dev, 3, torch.bfloat16, 1, 6144, 4096, epilogue=True) > 0
    assert tiled.bulk_ctas(lib, dev, 5, torch.bfloat16, 1, 6144, 4096, epilogue=True) == 0
    assert tiled.bulk_ctas(lib, dev, 3, torch.bfloat16, 1, 6144, 4096) == 0
    assert tiled.bulk_ctas(lib, dev, 4, torch.bfloat16, 4, 6144, 4096, epilogue=True) > 0  # the layers: BULK_LAYER_MAX_M
    assert tiled.bulk_ctas(lib, dev, 3, torch.bfloat16, 4, 6144, 4096, epilogue=True) == 0
    assert tiled.bulk_ctas(lib, dev, 2, torch.bfloat16, 4, 6144, 4096, epilogue=True) > 0
    assert tiled.bulk_ctas(lib, dev, 2, torch.bfloat16, 5, 6144, 4096, epilogue=True) == 0
    assert tiled.bulk_ctas(lib, dev, 4, torch.bfloat16, 2, 4096, 4096) == 0  # plain calls: one token (bulk_rule)


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_bulk_gemv_tokens_equal_one_token_calls(bits, dtype, gen):
    """m tokens in one call give each token's bits of a one-token call (the tokens are the MMA's columns: the same
    sums in the same order), over one, two and three slices of x (the last partial) and a padded last group."""
    lib = get_library()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n, k_in in ((300, 2048), (1000, 5120), (16 * sms + 48, 12288), (300, 2144)):
        q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=bits).to("cuda")
        ctas = min(sms, -(-n // 16))
        for m in (2, 4, 8):
            x = torch.randn(m, k_in, generator=gen).to(dtype).cuda()
            buf = torch.full((m * n,), float("nan"), dtype=dtype, device="cuda")
            _bulk_call(lib, x, q, buf, None, n, k_in, ctas, m=m)
            assert _rel(buf.view(m, n), _ref(x, q)) <= BOUND[dtype]  # right, not only equal
            for r in range(m):
                one = torch.full((n,), float("nan"), dtype=dtype, device="cuda")
                _bulk_call(lib, x[r : r + 1].clone(), q, one, None, n, k_in, ctas, m=1)
                assert torch.equal(buf.view(m, n)[r], one), f"K={bits} N={n} K_in={k_in} M={m} token {r}"


@pytest.mark.parametrize("m", [1, 4])
def test_bulk_gemv_deterministic_and_in_a_graph(m, gen, monkeypatch):
    """The bulk-copy GEMV gives the same bits on every call, eager or replayed in a CUDA graph."""
    monkeypatch.setattr(tiled, "DENSE_PATH", "bulk")
    q = lowbit.quantize_kbit(torch.randn(4096, 8192, generator=gen), bits=4).to("cuda")
    x = torch.randn(m, 8192, generator=gen).bfloat16().cuda()
    ys = [lowbit.kbit_linear(x, q) for _ in range(3)]
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    assert _rel(ys[0], _ref(x, q)) <= BOUND[torch.bfloat16]
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), torch.cuda.graph(g):
        y = lowbit.kbit_linear(x, q)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, ys[0])


_RING_RUN = """
import json, sys, torch, lowbit
from lowbit.kernels import tiled
tiled.DENSE_PATH = "bulk"
g = torch.Generator().manual_seed(int(sys.argv[2]))
ys = []
for bits, n, k_in, m in json.loads(sys.argv[3]):
    q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=g), bits=bits).to("cuda")
    x = torch.randn(m, k_in, generator=g).bfloat16().cuda()
    ys.append(lowbit.kbit_linear(x, q).cpu())
torch.save(ys, sys.argv[1])
"""


def test_bulk_gemv_ring_knobs_give_the_same_bits(gen, tmp_path):
    """LOWBIT_BULK_RING / LOWBIT_BULK_PREWAIT change when the weights land in the ring, not what is summed or in what
    order: every depth and every count of stages issued before the PDL wait gives the default's bits (K = 2, 3, 4;
    one and several slices of x, many stages per CTA; one and four tokens), and the default is right."""
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = [(4, 16 * sms * 3, 8192, 1), (4, 4096, 4096 + 512, 4), (3, 16 * sms + 48, 12288, 1), (2, 2000, 6144, 2)]
    root = Path(__file__).resolve().parents[2]
    knobs = ("LOWBIT_BULK_RING", "LOWBIT_BULK_PREWAIT")
    outs = {}
    for name, extra in (("default", {}), ("ring3", {"LOWBIT_BULK_RING": "3"}), ("ring8", {"LOWBIT_BULK_RING": "8"}),
                        ("prewait1", {"LOWBIT_BULK_RING": "4", "LOWBIT_BULK_PREWAIT": "1"})):
        env = {k: v for k, v in os.environ.items() if k not in knobs}
        env.update(extra, PYTHONPATH=str(root))
        out = tmp_path / f"{name}.pt"
        run = subprocess.run([sys.executable, "-c", _RING_RUN, str(out), str(seed), json.dumps(cases)], cwd=root, env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        outs[name] = torch.load(out)
    g = torch.Generator().manual_seed(seed)  # the same inputs here, for the reference
    for i, (bits, n, k_in, m) in enumerate(cases):
        q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=g), bits=bits)
        x = torch.randn(m, k_in, generator=g).bfloat16()
        assert _rel(outs["default"][i], _ref(x, q)) <= BOUND[torch.bfloat16]
        for name in ("ring3", "ring8", "prewait1"):
            assert torch.equal(outs[name][i], outs["default"][i]), f"{name}: K={bits} N={n} K_in={k_in} M={m}"


def test_gemv_in_cuda_graph(gen):
    q = lowbit.quantize_kbit(torch.randn(1024, 2048, generator=gen), bits=3).to("cuda")
    x = torch.randn(1, 2048, generator=gen).bfloat16().cuda()
    ref = lowbit.kbit_linear(x, q)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), torch.cuda.graph(g):
        y = lowbit.kbit_linear(x, q)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, ref)


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_grouped_matches_per_expert_reference(bits, dtype, gen):
    e, n, k_in = 16, 200, 512
    ex = lowbit.quantize_kbit_experts(torch.randn(e, n, k_in, generator=gen), bits=bits).to("cuda")
    counts = torch.randint(0, 4, (e,), generator=gen)
    counts[3] = 0  # empty experts
    counts[5] = 11  # more than 8 tokens: two passes
    off = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    x = torch.randn(int(off[-1]), k_in, generator=gen).to(dtype)
    y = lowbit.kbit_grouped_linear(x.cuda(), off.cuda(), ex)
    assert y.shape == (x.shape[0], n)
    for i in range(e):
        lo, hi = int(off[i]), int(off[i + 1])
        if hi > lo:
            err = _rel(y[lo:hi], _ref(x[lo:hi], ex.expert(i)))
            assert err <= BOUND[dtype], f"expert {i}: {err:.2e}"
    y2 = lowbit.kbit_grouped_linear(x.cuda(), off.cuda(), ex)
    assert torch.equal(y, y2)


def test_grouped_all_tokens_one_expert_and_empty_batch(gen):
    ex = lowbit.quantize_kbit_experts(torch.randn(4, 64, 256, generator=gen), bits=4).to("cuda")
    x = torch.randn(3, 256, generator=gen).half().cuda()
    off = torch.tensor([0, 0, 0, 3, 3], device="cuda")
    y = lowbit.kbit_grouped_linear(x, off, ex)
    assert _rel(y, _ref(x, ex.expert(2))) <= 1e-3
    empty = lowbit.kbit_grouped_linear(x[:0], torch.zeros(5, dtype=torch.int64, device="cuda"), ex)
    assert empty.shape == (0, 64)


@pytest.mark.parametrize("bits", [3, 4])
def test_grouped_many_experts_few_active_deterministic(bits, gen):
    """300 experts, 5 active (one with 11 tokens: two passes of 8), two runs bit-identical."""
    e_count, n, k_in = 300, 80, 2048
    ex = lowbit.quantize_kbit_experts(torch.randn(e_count, n, k_in, generator=gen), bits=bits).to("cuda")
    counts = torch.zeros(e_count, dtype=torch.int64)
    counts[torch.tensor([3, 77, 150, 151, 299])] = torch.tensor([1, 11, 2, 1, 3])
    off = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).cuda()
    x = torch.randn(int(counts.sum()), k_in, generator=gen).half().cuda()
    ys = [lowbit.kbit_grouped_linear(x, off, ex) for _ in range(3)]
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    for e in (3, 77, 150, 151, 299):
        lo, hi = int(off[e]), int(off[e + 1])
        assert _rel(ys[0][lo:hi], _ref(x[lo:hi], ex.expert(e))) <= 1e-3



@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("k_in", [512, 2048])
def test_grouped_many_active_many_tokens(bits, k_in, gen):
    """MoE at batch size: 160 experts, 100 active with 1..20 tokens each (up to 3 passes of 8), far
    more (expert, tile) items than one wave of CTAs. Direct C call into a NaN-filled output with a
    guard tail: every row is written, nothing past it; then the op twice, bit-identical."""
    e_count, n = 160, 96
    ex = lowbit.quantize_kbit_experts(torch.randn(e_count, n, k_in, generator=gen), bits=bits).to("cuda")
    counts = torch.zeros(e_count, dtype=torch.int64)
    active = torch.randperm(e_count, generator=gen)[:100]
    counts[active] = torch.randint(1, 21, (100,), generator=gen)
    off = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).cuda()
    x = torch.randn(int(counts.sum()), k_in, generator=gen).half().cuda()
    lib = get_library()
    qw, qa = ex.tiled()
    tokens = x.shape[0]
    buf = torch.full((tokens * n + 64,), float("nan"), dtype=torch.float16, device="cuda")
    args = [ptr(x), ptr(off), 0, ptr(qw), ptr(qa), ptr(ex.codebook), ptr(ex.scales), ptr(buf), ptr(None), e_count, n, k_in,
            split_max_ctas(lib, x.device, bits, torch.float16, e_count), 0, ptr(None), stream_of(x.device)]
    lib.call("kbit_split_gemv", args, bits=bits, dtype=torch.float16)
    torch.cuda.synchronize()
    assert buf[tokens * n :].isnan().all()
    y = buf[: tokens * n].view(tokens, n)
    assert not y.isnan().any()
    for e in active.tolist():
        lo, hi = int(off[e]), int(off[e + 1])
        err = _rel(y[lo:hi], _ref(x[lo:hi], ex.expert(e)))
        assert err <= 1e-3, f"expert {e} ({hi - lo} tokens): {err:.2e}"
    with dispatch.forced_path("gemv"):  # ~6 rows per expert: the dispatcher would take the grouped GEMM
        assert torch.equal(y, lowbit.kbit_grouped_linear(x, off, ex))


# ---- routed: MoE rows unsorted, route r = expert ids[r] times x row r // rows_per_x -------------------
def _routes(gen, count, experts, sentinels=True):
    """Router-like ids: duplicates (several routes to one expert), and expert-parallel sentinels
    (ids >= E) and a negative id when ``sentinels``."""
    ids = torch.randint(0, experts, (count,), generator=gen)
    if count >= 4:
        ids[1] = ids[0]  # a shared expert: one weight pass for both
        if sentinels:
            ids[2], ids[count - 1] = experts, -1
    return ids


def _routed_raw(ex, x, ids, rows_per_x, flags=0):
    """Direct C call of the routed GEMV into a NaN-filled output with a guard tail: (y, guard)."""
    lib = get_library()
    qw, qa = ex.tiled()
    (e_count, n, k_in), count = ex.shape, ids.shape[0]
    buf = torch.full((count * n + 64,), float("nan"), dtype=x.dtype, device="cuda")
    args = [ptr(x), ptr(ids), count, rows_per_x, ptr(qw), ptr(qa), ptr(ex.codebook), ptr(ex.scales), ptr(buf), e_count,
            n, k_in, split_max_ctas(lib, x.device, ex.bits, x.dtype, e_count), flags, stream_of(x.device)]
    lib.call("kbit_routed_gemv", args, bits=ex.bits, dtype=x.dtype)
    torch.cuda.synchronize()
    return buf[: count * n].view(count, n), buf[count * n :]


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("count,rows_per_x", [(1, 1), (8, 8), (37, 1), (64, 8), (256, 4)])
def test_routed_matches_sorted_grouped_kernel(bits, dtype, count, rows_per_x, gen):
    """Every routed row equals the sorted grouped kernel's row for it bit for bit (same weights, same
    MMA column), and the reference within the bound; sentinel rows are exact zeros; nothing past the
    output is written. Flags: PDL (1), one group per warp instead of one wave of items (16)."""
    e_count, n, k_in = 24, 200, 512 + 32
    ex = lowbit.quantize_kbit_experts(torch.randn(e_count, n, k_in, generator=gen), bits=bits).to("cuda")
    ids = _routes(gen, count, e_count)
    x = torch.randn(count // rows_per_x, k_in, generator=gen).to(dtype).cuda()
    for flags in (0, 1, 16, 17):
        y, guard = _routed_raw(ex, x, ids.cuda(), rows_per_x, flags)
        assert guard.isnan().all()
        assert not y.isnan().any()
        valid = (ids >= 0) & (ids < e_count)
        assert torch.equal(y[~valid.cuda()], torch.zeros_like(y[~valid.cuda()]))
        # the same rows sorted by expert through the grouped kernel
        order = torch.argsort(torch.where(valid, ids, e_count), stable=True)[: int(valid.sum())]
        counts = torch.bincount(ids[order], minlength=e_count)
        off = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).cuda()
        xs = x[(order // rows_per_x).cuda()]
        with dispatch.forced_path("gemv"):
            want = lowbit.kbit_grouped_linear(xs, off, ex)
        assert torch.equal(y[order.cuda()], want)
        for e in ids[order].unique().tolist():
            rows = order[ids[order] == e]
            err = _rel(y[rows.cuda()], _ref(x[(rows // rows_per_x).cuda()], ex.expert(e)))
            assert err <= BOUND[dtype], f"expert {e}: {err:.2e}"


def test_routed_op_errors_and_fallback(gen):
    """The op: bad arguments refused on CUDA as on CPU; more routes than the kernel takes, and fp32 x, run
    the reference (same rows)."""
    e_count, n, k_in = 8, 64, 256
    ex = lowbit.quantize_kbit_experts(torch.randn(e_count, n, k_in, generator=gen), bits=4).to("cuda")
    qw, qa = ex.tiled()
    args = (qw, qa, ex.codebook, ex.scales, 4, n, k_in)
    x = torch.randn(2, k_in, generator=gen).half().cuda()
    with pytest.raises(ValueError, match="route_ids must have"):
        lowbit.ops.kbit_routed_gemv(x, torch.zeros(3, dtype=torch.int64, device="cuda"), *args, 1)
    with pytest.raises(ValueError, match="rows_per_x"):
        lowbit.ops.kbit_routed_gemv(x, torch.zeros(2, dtype=torch.int64, device="cuda"), *args, 0)
    with pytest.raises(TypeError):
        lowbit.ops.kbit_routed_gemv(x, torch.zeros(2, dtype=torch.int32, device="cuda"), *args, 1)
    big = lowbit.ops.ROUTED_MAX_ROUTES + 8
    ids = torch.randint(0, e_count, (big,), generator=gen).cuda()
    xb = torch.randn(big // 8, k_in, generator=gen).half().cuda()
    y = lowbit.ops.kbit_routed_gemv(xb, ids, *args, 8)
    y32 = lowbit.ops.kbit_routed_gemv(xb.float(), ids, *args, 8)
    assert _rel(y, y32.half().cpu().double()) <= BOUND[torch.float16]
    y_kernel = lowbit.ops.kbit_routed_gemv(xb[:32], ids[:256], *args, 8)  # at the limit: the kernel
    assert _rel(y_kernel, y[:256].cpu().double()) <= BOUND[torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_experts_module_routed_equals_sorted_and_replays_new_routing(dtype, gen, monkeypatch):
    """KbitMoeExperts at decode sizes runs routed (no sort): bit-equal to the sorted block for 1-8 tokens with
    shared experts and sentinels when the activation is its own step (ROUTED_SWIGLU off), within the dtype's bound
    when the down GEMV computes it (silu(gate) * up rounded once instead of twice); captured in a CUDA graph under
    PDL with the routing rewritten between replays, still equal."""
    from lowbit.nn import experts as nn_experts

    e_count, h, inter = 32, 256, 160
    src = torch.nn.Module()
    src.gate_up_proj = torch.nn.Parameter(torch.randn(e_count, 2 * inter, h, generator=gen) * 0.1)
    src.down_proj = torch.nn.Parameter(torch.randn(e_count, h, inter, generator=gen) * 0.1)
    src.act_fn = torch.nn.SiLU()
    ex = lowbit.nn.KbitMoeExperts.from_experts(src, bits=4).to(dtype).cuda()

    def run(routed, *a):
        monkeypatch.setattr(dispatch, "MOE_ROUTED", routed)
        return ex(*a)

    with torch.no_grad():
        for tokens in (1, 3, 8):
            hs = torch.randn(tokens, h, generator=gen).to(dtype).cuda()
            idx = _routes(gen, tokens * 4, e_count).view(tokens, 4).cuda()
            w = torch.rand(tokens, 4, generator=gen).to(dtype).cuda()
            monkeypatch.setattr(dispatch, "MOE_ROUTED", True)
            assert dispatch.moe_routed(hs, idx.numel(), e_count)
            sorted_ = run(False, hs, idx, w)
            monkeypatch.setattr(nn_experts, "ROUTED_SWIGLU", False)
            got = run(True, hs, idx, w)
            assert torch.isfinite(got).all()
            assert torch.equal(got, sorted_), f"{tokens} tokens"
            monkeypatch.setattr(nn_experts, "ROUTED_SWIGLU", True)
            got = run(True, hs, idx, w)
            assert torch.isfinite(got).all() and _rel(got, sorted_.cpu().double()) <= BOUND[dtype], f"{tokens} tokens, swiglu"
        monkeypatch.setattr(dispatch, "MOE_ROUTED", True)
        ex._launchers = None
        with lowbit.programmatic_launch():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                ex(hs, idx, w)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = ex(hs, idx, w)
        for _ in range(3):
            idx.copy_(_routes(gen, idx.numel(), e_count).view(idx.shape))
            hs.copy_(torch.randn(hs.shape, generator=gen).to(dtype))
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, run(True, hs, idx, w))  # the routed block run eagerly


@pytest.mark.parametrize("dense_path", ["split", "streamk", "local"])
def test_pdl_chain_in_graph_equals_serialized_chain(dense_path, gen, monkeypatch):
    """Programmatic dependent launch: y2 = W2 (W1 x) (kbit GEMVs back to back, the second reading the
    first's output) and a grouped GEMV whose expert offsets come from the kernel before it, captured
    in a CUDA graph with PDL, bit-equal to the same chain launched without it."""
    monkeypatch.setattr(tiled, "DENSE_PATH", dense_path)
    w1 = lowbit.nn.KbitLinear.from_linear(torch.nn.Linear(2048, 4096, bias=False), bits=4).half().cuda()
    w2 = lowbit.nn.KbitLinear.from_linear(torch.nn.Linear(4096, 1024, bias=False), bits=3).half().cuda()
    experts, n, k_in = 16, 512, 1024
    ex = lowbit.quantize_kbit_experts(torch.randn(experts, n, k_in, generator=gen), bits=4).to("cuda")
    counts = torch.randint(0, 3, (experts,), generator=gen).cuda()
    x = torch.randn(2, 2048, generator=gen).half().cuda()
    xg = torch.randn(int(counts.sum()), k_in, generator=gen).half().cuda()

    def chain():
        y = w2(w1(x))
        off = torch.cat([counts.new_zeros(1), counts.cumsum(0)])  # written by a kernel right before the GEMV
        return y, lowbit.kbit_grouped_linear(xg, off, ex)

    with torch.no_grad():
        want = chain()
        for t in want:
            assert torch.isfinite(t).all()
        with lowbit.programmatic_launch():
            w1._launcher = w2._launcher = None
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                chain()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                got = chain()
        for _ in range(3):
            for t in got:
                t.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            for a, b in zip(got, want):
                assert torch.equal(a, b)


# ---- rotation = 32: the kernels multiply by x H (block-32 Hadamard) in registers --------------------
def _rotated_ref(x, q):
    """fp64 (x H) W^T: what a weight stored as W H gives a rotated GEMV (lowbit/formats/kbit/rotation.py)."""
    from lowbit.formats.kbit import rotation

    x = x.cpu().double()
    return _ref((x.reshape(x.shape[0], -1, 32) @ rotation.hadamard().double()).reshape(x.shape), q)


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_rotated_gemv_matches_reference(bits, m, dtype, dense_path, gen):
    """x H is computed by tensor-core MMAs and rounded once to x's dtype: the bound stays the plain GEMV's.
    Poisoned output: every element written."""
    for n, k_in in _shapes(gen):
        q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=bits).to("cuda")
        qw, qa = q.tiled()
        x = (torch.randn(m, k_in, generator=gen) * torch.rand(k_in, generator=gen) * 4).to(dtype).cuda()
        y = lowbit.ops.kbit_gemv(x, qw, qa, q.codebook, q.scale, bits, n, k_in, None, 32)
        err = _rel(y, _rotated_ref(x, q))
        assert err <= BOUND[dtype], f"N={n} K_in={k_in}: rel err {err:.2e}"


@pytest.mark.parametrize("pdl", [0, 1])
@pytest.mark.parametrize("dense_kernel", ["kbit_gemv", "kbit_split_gemv"])
def test_rotated_gemv_poisoned_output_and_guard(pdl, dense_kernel, gen):
    """Direct C call with the rotation flag (and PDL) on a NaN-filled buffer with a guard tail."""
    for n, k_in, m in ((37, 96, 1), (1000, 4096, 3), (64, 8192, 8)):
        q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=3).to("cuda")
        x = torch.randn(m, k_in, generator=gen).half().cuda()
        qw, qa = q.tiled()
        lib = get_library()
        buf = torch.full((m * n + 64,), float("nan"), dtype=torch.float16, device="cuda")
        flags = pdl | tiled.FLAG_ROT32
        if dense_kernel == "kbit_gemv":
            warps = gemv_warps(lib, x.device, 3, torch.float16, m, n, k_in)
            ws = torch.full((warps, 2, 128), float("nan"), dtype=torch.float32, device="cuda")
            args = [ptr(x), ptr(qw), ptr(qa), ptr(q.codebook), ptr(q.scale), ptr(buf), ptr(None), ptr(ws),
                    ptr(counters(x.device, -(-n // 16))), m, n, k_in, warps, flags, ptr(None), stream_of(x.device)]
            lib.call("kbit_gemv", args, bits=3, dtype=torch.float16, m=tiled.gemv_instance(m))
        else:
            ctas = split_max_ctas(lib, x.device, 3, torch.float16, 1)
            args = [ptr(x), ptr(None), m, ptr(qw), ptr(qa), ptr(q.codebook), ptr(q.scale), ptr(buf), ptr(None), 1, n,
                    k_in, ctas, flags, ptr(None), stream_of(x.device)]
            lib.call("kbit_split_gemv", args, bits=3, dtype=torch.float16)
        torch.cuda.synchronize()
        assert _rel(buf[: m * n].view(m, n), _rotated_ref(x, q)) <= 1e-3
        assert buf[m * n :].isnan().all()


def test_rotated_gemv_refused_for_nvfp4():
    """The NVFP4 instances have no rotation: the flag is an error, not a silent unrotated product."""
    w = lowbit.quantize_nvfp4(torch.randn(64, 256)).to("cuda")
    qw, qs = w.tiled()
    lib = get_library()
    x = torch.randn(1, 256).half().cuda()
    y = torch.empty(1, 64, dtype=torch.float16, device="cuda")
    ctas = split_max_ctas(lib, x.device, tiled.NVFP4, torch.float16, 1)
    from lowbit.kernels.nvfp4 import e2m1_codebook

    args = [ptr(x), ptr(None), 1, ptr(qw), ptr(qs), ptr(e2m1_codebook(x.device)), ptr(w.scale_2), ptr(y), ptr(None), 1,
            64, 256, ctas, tiled.FLAG_ROT32, ptr(None), stream_of(x.device)]
    with pytest.raises(RuntimeError, match="invalid argument"):
        lib.call("nvfp4_split_gemv", args, dtype=torch.float16)


def test_rotated_module_eager_compiled_and_graph_agree(gen):
    """KbitLinear(rotation=32) on every path: eager launcher (GEMV), the op under torch.compile, a CUDA
    graph replay, and M > 8 (the GEMM on x H from PyTorch) -- all against the module's CPU reference."""
    lin = torch.nn.Linear(512, 300, bias=True)
    mod = lowbit.nn.KbitLinear.from_linear(lin, bits=4, rotation=32)
    cpu = mod.dequantize(torch.float32)
    mod = mod.to("cuda", torch.bfloat16)
    for m in (1, 5, 40):
        x = torch.randn(m, 512, generator=gen).bfloat16().cuda()
        want = (x.float().cpu() @ cpu.t() + lin.bias.detach().float()).double()
        assert _rel(mod(x), want) < 1e-2
    x = torch.randn(2, 512, generator=gen).bfloat16().cuda()
    eager = mod(x)
    assert torch.equal(torch.compile(mod, fullgraph=True)(x), eager)
    g, out = capture(lambda: mod(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_a_refused_configuration_leaves_no_cuda_error_behind(gen):
    """More experts than the grouped kernel's shared memory holds: the occupancy query says so (ValueError) and a launch
    anyway fails (RuntimeError), and afterwards PyTorch's and lowbit's next launches run: the refused
    cudaFuncSetAttribute is not left as the runtime's last error for them to report."""
    lib = get_library()
    dev = torch.device("cuda", torch.cuda.current_device())
    too_many = 20000  # 16 bytes of shared memory per expert: > 227 KB
    with pytest.raises(ValueError, match="do not fit"):
        split_max_ctas(lib, dev, 4, torch.float16, too_many)
    assert torch.equal(torch.ones(8, device="cuda") + 1, torch.full((8,), 2.0, device="cuda"))
    q = lowbit.quantize_kbit(torch.randn(64, 256, generator=gen), bits=4).to("cuda")
    x = torch.randn(1, 256, generator=gen).half().cuda()
    y = torch.empty(too_many, 64, dtype=torch.float16, device="cuda")
    off = torch.zeros(too_many + 1, dtype=torch.int64, device="cuda")
    qw, qa = q.tiled()
    args = [ptr(x), ptr(off), 0, ptr(qw), ptr(qa), ptr(q.codebook), ptr(q.scale), ptr(y), ptr(None), too_many, 64, 256,
            132, 0, ptr(None), stream_of(x.device)]
    with pytest.raises(RuntimeError, match="lowbit CUDA kernel kbit_split_gemv"):
        lib.call("kbit_split_gemv", args, bits=4, dtype=torch.float16)
    z = torch.randn(32, 32, device="cuda")
    assert torch.allclose(z @ z, (z.double() @ z.double()).float(), rtol=1e-3, atol=1e-3)  # cuBLAS runs
    want = _ref(x, q)
    assert _rel(lowbit.kbit_linear(x, q), want) <= BOUND[torch.float16]  # and lowbit's own kernels
    torch.cuda.synchronize()


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("routes", [8, 24, 64])
def test_routed_swiglu_down(bits, routes, dtype, gen):
    """The routed down GEMV on gate|up's output (swiglu=True): each route's row is silu(gate) * up times its expert,
    within the dtype's bound of the fp64 product of ops.swiglu_reference(x) (the activation staged per CTA, once
    rounded; __expf against torch's sigmoid may flip a rounding), zero rows for sentinel ids, NaN never, under PDL
    in a graph too."""
    e_count, n, k_in = 16, 192, 768
    ex = lowbit.quantize_kbit_experts(torch.randn(e_count, n, k_in, generator=gen), bits=bits).to("cuda")
    qw, qa = ex.tiled()
    args = (qw, qa, ex.codebook, ex.scales, bits, n, k_in)
    gu = (torch.randn(routes, 2 * k_in, generator=gen) * 2).to(dtype).cuda()
    ids = _routes(gen, routes, e_count)
    if routes > 8:
        ids[3:12] = ids[0]  # 11 routes of one expert: two chunks of staged rows in one CTA
    ids = ids.cuda()
    y = lowbit.ops.kbit_routed_gemv(gu, ids, *args, 1, True)
    assert y.shape == (routes, n) and not y.isnan().any()
    act = lowbit.ops.swiglu_reference(gu)
    for r, e in enumerate(ids.tolist()):
        if 0 <= e < e_count:
            err = _rel(y[r : r + 1], _ref(act[r : r + 1], ex.expert(e)))
            assert err <= BOUND[dtype], f"route {r} expert {e}: {err:.2e}"
        else:
            assert (y[r] == 0).all(), f"sentinel route {r}"
    with lowbit.programmatic_launch():
        g, out = capture(lambda: lowbit.ops.kbit_routed_gemv(gu, ids, *args, 1, True))
        gu.copy_((torch.randn(routes, 2 * k_in, generator=gen) * 2).to(dtype))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, lowbit.ops.kbit_routed_gemv(gu, ids, *args, 1, True))


@pytest.mark.parametrize("bits", [3, 4])
def test_measured_picks_choose_plain_calls_kernel(bits, gen, tmp_path, monkeypatch):
    """A user crossover file's gemv_kernels (lowbit tune --gemv-kernels) picks a plain one-token call's kernel, each
    pick gives the reference's result, and the decode layers' calls (an epilogue) keep their rules."""
    from lowbit.kernels import picks
    from lowbit.kernels.device import gpu_name

    user = tmp_path / "kbit_dispatch.json"
    monkeypatch.setenv("LOWBIT_DISPATCH_FILE", str(user))
    n, k_in = 4096, 4096
    q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=bits).to("cuda")
    x = torch.randn(1, k_in, generator=gen).bfloat16().cuda()
    qw, qa = q.tiled()
    gpu = gpu_name(x.device)
    lib = get_library()

    def launcher():
        return tiled.GemvLauncher(lib, qw, qa, q.codebook, q.scale, tiled.kbit_format(bits), n, k_in)

    rules = [launcher()._plan(torch.bfloat16, m, epi=epi)[0] for m, epi in ((2, False), (1, True))]
    try:
        for kernel in picks.KERNELS[f"kbit{bits}"]:
            entry = {"gemv_kernels": [[f"kbit{bits}", n, k_in, kernel]]}
            user.write_text(json.dumps({"version": 1, "gpus": {gpu: entry}}))
            picks.reload()
            launch = launcher()
            plan = launch._plan(torch.bfloat16, 1)
            assert plan[0] == {"bulk": "bulk", "split": "split"}.get(kernel, "streamk"), kernel
            if plan[0] == "streamk":
                assert bool(plan[-1] & tiled.FLAG_LOCAL) == (kernel == "local"), kernel
            y = torch.full((1, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            launch(x, 1, (1, n), y=y)
            err = _rel(y, _ref(x, q))
            assert err <= BOUND[torch.bfloat16], f"{kernel}: rel err {err:.2e}"
            # two tokens and the decode layers' calls keep the rules
            assert [launch._plan(torch.bfloat16, m, epi=epi)[0] for m, epi in ((2, False), (1, True))] == rules
    finally:
        picks.reload()


def test_tune_gemv_kernels_cli_writes_picks(tmp_path):
    """``lowbit tune --gemv-kernels`` as a user types it: times the kernels of one shape and writes a loadable file."""
    import subprocess
    import sys

    out = tmp_path / "d.json"
    r = subprocess.run([sys.executable, "-m", "lowbit", "tune", "--gemv-kernels", "--shape", "2048x2048", "--formats",
                        "kbit4,nvfp4", "--replays", "2", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "kbit4 2048x2048" in r.stdout and "nvfp4 2048x2048" in r.stdout and "plain" in r.stdout
    assert "rules:" in r.stdout and "wrote" in r.stdout
    entry = next(iter(json.loads(out.read_text())["gpus"].values()))
    assert isinstance(entry["gemv_kernels"], list)
    dispatch.load_crossovers(out)
    bad = subprocess.run([sys.executable, "-m", "lowbit", "tune", "--gemv-kernels", "--formats", "kbit4,int4"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--formats" in bad.stderr


@pytest.mark.parametrize("kernel", ["plain", "tiled"])
def test_nvfp4_picks_choose_its_gemv(kernel, gen, tmp_path, monkeypatch):
    """NVFP4 at one row: a measured pick runs the checkpoint-layout or the tiled GEMV, both the reference's result."""
    from lowbit.kernels import picks
    from lowbit.kernels.device import gpu_name

    user = tmp_path / "kbit_dispatch.json"
    monkeypatch.setenv("LOWBIT_DISPATCH_FILE", str(user))
    n, k_in = 1024, 4096
    dev = torch.device("cuda", torch.cuda.current_device())
    user.write_text(json.dumps({"version": 1, "gpus": {gpu_name(dev): {"gemv_kernels": [["nvfp4", n, k_in, kernel]]}}}))
    picks.reload()
    try:
        assert dispatch.nvfp4_plain_wins(1, n, k_in, dev) == (kernel == "plain")
        w = torch.randn(n, k_in, generator=gen)
        q = lowbit.quantize_nvfp4(w.cuda().half())
        x = torch.randn(1, k_in, generator=gen).bfloat16().cuda()
        y = lowbit.nvfp4_linear(x, q).cpu().double()
        ref = x.cpu().double() @ q.dequantize(torch.float32).cpu().double().t()
        assert not y.isnan().any()
        assert ((y - ref).norm() / ref.norm()).item() <= BOUND[torch.bfloat16]
    finally:
        picks.reload()
