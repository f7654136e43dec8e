"""fp16/bf16 decode GEMV kernels (csrc/dense/gemv.cu) against an fp64 reference.

Bound: relative norm error <= 1e-3 against the fp64 product rounded to the output dtype (for fp16
also against the unrounded product). bf16's own output rounding is ~1.5e-3 rms, so comparing a
bf16 result with the unrounded product would test the format, not the kernel.
"""

import pytest
import torch

import lowbit
from lowbit import tuning
from lowbit.kernels.dense import launch, vector_ok
from lowbit.kernels.library import get_library

pytestmark = pytest.mark.gpu
DTYPES = [torch.float16, torch.bfloat16]
ids = lambda d: str(d).removeprefix("torch.")  # noqa: E731


def _check(y, x, w):
    ref = x.double().cpu() @ w.double().cpu().t()
    y = y.cpu().double()
    assert not y.isnan().any(), "NaN in output"
    err_rounded = ((y - ref.to(w.dtype).double()).norm() / ref.norm()).item()
    assert err_rounded <= 1e-3, f"rel err vs rounded fp64 reference {err_rounded:.2e}"
    if w.dtype == torch.float16:
        err = ((y - ref).norm() / ref.norm()).item()
        assert err <= 1e-3, f"rel err vs fp64 reference {err:.2e}"


def _shapes(gen):
    r = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=gen))  # noqa: E731
    yield r(1, 300), 8 * r(1, 300)            # vector kernel, random N
    yield 2 * r(1, 200) + 1, 8 * r(1, 64) + 8  # odd N
    yield r(1, 100), 2 * r(1, 300) + 1         # odd K: scalar kernel
    yield 4096 + 3, 2048                       # many CTAs, N tail


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_dense_gemv_matches_reference(m, dtype, gen):
    for n, k in _shapes(gen):
        w = torch.randn(n, k, generator=gen).to(dtype).cuda()
        x = torch.randn(m, k, generator=gen).to(dtype).cuda()
        y = lowbit.dense_linear(x, w)
        assert y.shape == (m, n) and y.dtype == dtype
        _check(y, x, w)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_every_config_poisoned_output_and_guard(m, dtype, gen):
    """Every tunable configuration, direct C call into a NaN buffer with a guard tail."""
    lib = get_library()
    n, k = 333, 8 * 97  # N not a multiple of any rows-per-CTA, K not a multiple of any tpr*unroll*8
    w = torch.randn(n, k, generator=gen).to(dtype).cuda()
    x = torch.randn(m, k, generator=gen).to(dtype).cuda()
    for cfg in tuning.candidates() + [None]:
        for pdl in (False, True):
            buf = torch.full((m * n + 64,), float("nan"), dtype=dtype, device="cuda")
            launch(lib, x, w, buf[: m * n].view(m, n), cfg, pdl=pdl)
            torch.cuda.synchronize()
            assert buf[m * n :].isnan().all(), f"{cfg} pdl={pdl} wrote past the output"
            _check(buf[: m * n].view(m, n), x, w)


def test_misaligned_x_uses_scalar_kernel(gen):
    w = torch.randn(100, 256, generator=gen).half().cuda()
    flat = torch.randn(2 * 256 + 4, generator=gen).half().cuda()
    x = flat[4:].view(2, 256)
    assert not vector_ok(x, w)
    _check(lowbit.dense_linear(x, w), x, w)


def test_deterministic_and_graph_safe(gen):
    w = torch.randn(8192, 4096, generator=gen).bfloat16().cuda()
    x = torch.randn(3, 4096, generator=gen).bfloat16().cuda()
    ys = [lowbit.dense_linear(x, w) for _ in range(3)]
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), torch.cuda.graph(g):
        yg = lowbit.dense_linear(x, w)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(yg, ys[0])


@pytest.mark.parametrize("rows", tuning.MMA_ROWS)
def test_tensor_core_configs_deterministic(rows, gen):
    """Split-K over 16 warps of a group (shared-memory reduction) gives bit-identical reruns."""
    lib = get_library()
    w = torch.randn(1000, 8 * 515, generator=gen).half().cuda()
    x = torch.randn(4, 8 * 515, generator=gen).half().cuda()
    cfg = tuning.GemvConfig(rows=rows, unroll=1, tpr=512, threads=512, prefetch=0).validate()
    ys = []
    for _ in range(3):
        y = torch.full((4, 1000), float("nan"), dtype=torch.float16, device="cuda")
        launch(lib, x, w, y, cfg)
        ys.append(y)
    _check(ys[0], x, w)
    assert all(torch.equal(ys[0], y) for y in ys[1:])


@pytest.mark.parametrize("m", [1, 4])
def test_programmatic_launch_chain_in_graph(m, gen):
    """With PDL each kernel may start before its predecessor ends; a chain y2 = f(f(x)) in a CUDA
    graph, x rewritten between replays, must match the same chain launched without PDL (the
    kernels are deterministic, so bit for bit), for a CUDA-core and a tensor-core config."""
    lib = get_library()
    k, n1, n2 = 8 * 300, 8 * 250, 1000
    w1 = torch.randn(n1, k, generator=gen).half().cuda()
    w2 = torch.randn(n2, n1, generator=gen).half().cuda() / 30
    x = torch.empty(m, k, dtype=torch.float16, device="cuda")
    for cfg in (tuning.GemvConfig(1, 2, 64, 256, 0), tuning.GemvConfig(16, 2, 128, 256, 1)):
        y1 = torch.empty(m, n1, dtype=torch.float16, device="cuda")
        y2 = torch.empty(m, n2, dtype=torch.float16, device="cuda")

        def chain(pdl):
            launch(lib, x, w1, y1, cfg, pdl=pdl)
            launch(lib, y1, w2, y2, cfg, pdl=pdl)

        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        x.normal_()
        with torch.cuda.stream(s):
            chain(True)  # warm-up outside capture
        torch.cuda.synchronize()
        with torch.cuda.stream(s), torch.cuda.graph(g):
            chain(True)
        for _ in range(3):
            x.copy_(torch.randn(m, k, generator=gen).half())
            y1.fill_(float("nan"))
            y2.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            got = y2.clone()
            chain(False)
            torch.cuda.synchronize()
            diff = (got.float() - y2.float()).abs().nan_to_num(float("inf")).max().item()
            assert torch.equal(got, y2), f"{cfg}: PDL chain differs from the serialized one (max |diff| {diff})"
            _check(y2, y1, w2)


def test_large_m_goes_to_cublas(gen):
    w = torch.randn(64, 128, generator=gen).half().cuda()
    x = torch.randn(2, 5, 128, generator=gen).half().cuda()
    y = lowbit.dense_linear(x, w)
    assert y.shape == (2, 5, 64)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w))


def test_tune_one_small_shape():
    """The tuner checks and times every candidate and returns the fastest."""
    from lowbit.bench.tune import tune_one

    best, us, results = tune_one(get_library(), torch.float16, 1, 512, 2048, replays=2)
    assert len(results) == len(tuning.candidates()) and us == min(u for _c, u in results) and us > 0
    assert best in tuning.candidates()
