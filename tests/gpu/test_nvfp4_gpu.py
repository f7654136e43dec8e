"""NVFP4 on CUDA: the tensor-core GEMM (csrc/kbit/gemm.cu, FP4 instances) against the format reference.

Reference: an fp64 product of the reference-dequantized weight (E2M1 x E4M3 x scale_2). The kernel's
A fragments are exact (E2M1 x E4M3 fits fp16/bf16), so only the MMA's fp32 sums and the output
rounding differ: bounds fp16 <= 1e-3, bf16 <= 8e-3 (kbit_check.BOUND); NaN never passes.
"""

import pytest
import torch

import lowbit
from lowbit.formats import nvfp4
from lowbit.kernels import nvfp4 as cuda_nvfp4
from lowbit.kernels import tiled
from lowbit.kernels.library import get_library, ptr, stream_of

from .kbit_check import BOUND, DTYPES, capture
from .kbit_check import dtype_id as ids
from .kbit_check import rel as _rel

pytestmark = pytest.mark.gpu


def _ref(x, q):
    return x.cpu().double() @ q.to("cpu").dequantize(torch.float64).t()


def _shapes(gen):
    yield 16 * int(torch.randint(1, 40, (1,), generator=gen)) - 3, 32 * int(torch.randint(1, 30, (1,), generator=gen))
    yield 64, 4096  # one row block: deep split-K
    yield 1000, 2048 + 96  # K not a multiple of 256


def _raw(q, x, splits):
    """Direct C call: NaN-filled output with a guard tail, NaN-filled workspace."""
    lib = get_library()
    n, k = q.shape
    m = x.shape[0]
    qw, qs = q.tiled()
    launch = cuda_nvfp4.gemm_launcher(lib, qw, qs, q.scale_2, n, k)
    _, nt, r, splits, ws_floats, cnt = launch.plan(x.dtype, m, splits)
    buf = torch.full((m * n + 64,), float("nan"), dtype=x.dtype, device="cuda")
    ws = torch.full((max(ws_floats, 1),), float("nan"), dtype=torch.float32, device="cuda")
    args = [ptr(x), ptr(qw), ptr(qs), ptr(cuda_nvfp4.e2m1_codebook(x.device)), ptr(q.scale_2), ptr(buf), ptr(None),
            ptr(ws) if ws_floats else ptr(None), ptr(cnt), m, n, k, splits, stream_of(x.device)]
    lib.call("nvfp4_gemm", args, dtype=x.dtype, nt=nt, r=r)
    torch.cuda.synchronize()
    assert buf[m * n:].isnan().all(), "wrote past the output"
    return buf[: m * n].view(m, n)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("m", [1, 5, 9, 16, 17, 33, 64, 65, 130])
@pytest.mark.parametrize("tiles_per_warp", [1, 2])
def test_nvfp4_gemm_matches_reference(dtype, m, tiles_per_warp, gen, monkeypatch):
    """Full-range weights (outliers: block scales across the E4M3 range), odd N, K % 256 != 0,
    K split one way, by the rule, and as far as it goes."""
    monkeypatch.setattr(tiled, "GEMM_TILES_PER_WARP", tiles_per_warp)
    for n, k in _shapes(gen):
        w = torch.randn(n, k, generator=gen) * 0.02 * torch.exp(torch.randn(n, 1, generator=gen))  # rows e^+-3 apart: block scales across E4M3, outputs within fp16
        q = lowbit.quantize_nvfp4(w).to("cuda")
        x = torch.randn(m, k, generator=gen).to(dtype).cuda()
        ref = _ref(x, q)
        groups = -(-k // 256)
        for splits in sorted({1, None, groups}, key=lambda s: -1 if s is None else s):
            err = _rel(_raw(q, x, splits), ref)
            assert err <= BOUND[dtype], f"N={n} K={k} M={m} splits={splits}: rel err {err:.2e}"


def test_nvfp4_gemm_op_deterministic_and_in_cuda_graph(gen):
    q = lowbit.quantize_nvfp4(torch.randn(256, 8192, generator=gen)).to("cuda")
    qw, qs = q.tiled()
    x = torch.randn(40, 8192, generator=gen).half().cuda()
    run = lambda: lowbit.ops.nvfp4_gemm(x, qw, qs, q.scale_2, 256, 8192)  # noqa: E731
    ys = [run() for _ in range(3)]
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    assert _rel(ys[0], _ref(x, q)) <= BOUND[torch.float16]
    g, y = capture(run)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, ys[0])


def test_nvfp4_e4m3_scale_extremes(gen):
    """Blocks at the largest (448) and smallest subnormal (2^-9) E4M3 scales and zero blocks."""
    n, k = 32, 512
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    raw = torch.randint(0, 127, (n, k // 16), generator=gen, dtype=torch.uint8)
    raw[0] = 126  # 448
    raw[1] = 1    # 2^-9
    raw[2] = 0    # 0
    q = nvfp4.NvFp4Weight(nvfp4.pack(codes), raw.view(torch.float8_e4m3fn), torch.tensor(1 / 16)).to("cuda")
    x = torch.randn(17, k, generator=gen).half().cuda()  # outputs: row 0 ~1e3, row 1 ~1e-2 (fp16 normals)
    y, ref = _raw(q, x, None), _ref(x, q)
    assert _rel(y, ref) <= BOUND[torch.float16]
    assert _rel(y[:, 1], ref[:, 1]) <= BOUND[torch.float16]  # the smallest scales, on their own norm
    assert (y[:, 2] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("path", ["streamk", "local", "split"])
def test_nvfp4_gemv_matches_reference(dtype, m, path, gen, monkeypatch):
    """The decode GEMV (both kernels) on NVFP4 weights: full-range scales, odd N, K % 256 != 0."""
    monkeypatch.setattr(tiled, "DENSE_PATH", path)
    for n, k in [(16 * 37 - 5, 32 * 23), (4096, 1024), (300, 2048 + 96)]:
        w = torch.randn(n, k, generator=gen) * 0.02 * torch.exp(torch.randn(n, 1, generator=gen))  # rows e^+-3 apart: block scales across E4M3, outputs within fp16
        q = lowbit.quantize_nvfp4(w).to("cuda")
        qw, qs = q.tiled()
        x = torch.randn(m, k, generator=gen).to(dtype).cuda()
        y = lowbit.ops.nvfp4_gemv(x, qw, qs, q.scale_2, n, k)
        err = _rel(y, _ref(x, q))
        assert err <= BOUND[dtype], f"{path} N={n} K={k} M={m}: rel err {err:.2e}"
        assert torch.equal(y, lowbit.ops.nvfp4_gemv(x, qw, qs, q.scale_2, n, k))  # deterministic


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_fused_nvfp4_model_matches_its_cpu_reference(dtype, gen):
    """quantize_model(format="nvfp4", fuse=True) on CUDA: one weight per q|k|v and gate|up group, the decode GEMVs
    (M = 1, 3) and the GEMM path (M = 11) on it, against the same fused model's fp32 CPU reference."""
    from lowbit.nn import FusedNvFp4Linear

    from ..tiny_models import build, reference_copy, rel_err

    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    model = build("llama", seed, dtype=dtype, device="cuda")
    lowbit.quantize_model(model, format="nvfp4", fuse=True, progress=False)
    assert sum(isinstance(m, FusedNvFp4Linear) for m in model.modules()) == 2 * len(model.model.layers)
    ref = reference_copy(model, build("llama", seed))  # fp32 CPU, the quantized weights dequantized
    for batch, seq in [(1, 1), (3, 1), (1, 11)]:
        ids_ = torch.randint(0, 320, (batch, seq), generator=gen)
        with torch.no_grad():
            got = model(ids_.cuda()).logits.float().cpu()
            want = ref(ids_).logits
        assert not got.isnan().any() and rel_err(got, want) < {torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
