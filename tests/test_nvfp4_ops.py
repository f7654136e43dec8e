"""The NVFP4 ops on the checkpoint layout, on CPU (their reference paths) and their argument checks:
nvfp4_plain_gemv (W4A16), nvfp4_w4a4_gemv (GPU MODE nvfp4_gemv semantics), nvfp4_quantize_act."""

import pytest
import torch

import lowbit
from lowbit import ops
from lowbit.formats import nvfp4


def test_plain_gemv_cpu_is_the_reference(gen):
    q = lowbit.quantize_nvfp4(torch.randn(37, 96, generator=gen))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn(3, 96, generator=gen).to(dtype)
        y = ops.nvfp4_plain_gemv(x, q.packed, q.scales, q.scale_2)
        assert y.dtype == dtype and torch.equal(y, nvfp4.linear_reference(x, q))


def test_plain_gemv_rejects_bad_input(gen):
    q = lowbit.quantize_nvfp4(torch.randn(8, 64, generator=gen))
    x = torch.randn(1, 64, generator=gen)
    with pytest.raises(ValueError, match="multiple of 32"):
        q48 = lowbit.quantize_nvfp4(torch.randn(8, 48, generator=gen))
        ops.nvfp4_plain_gemv(torch.randn(1, 48), q48.packed, q48.scales, q48.scale_2)
    with pytest.raises(TypeError, match="packed must have dtype"):
        ops.nvfp4_plain_gemv(x, q.packed.to(torch.int8), q.scales, q.scale_2)
    with pytest.raises(TypeError, match="scales must have dtype"):
        ops.nvfp4_plain_gemv(x, q.packed, q.scales.view(torch.uint8), q.scale_2)
    with pytest.raises(ValueError, match="scales must be"):
        ops.nvfp4_plain_gemv(x, q.packed, q.scales[:, :3].contiguous(), q.scale_2)
    with pytest.raises(ValueError, match="x must have shape"):
        ops.nvfp4_plain_gemv(torch.randn(1, 32), q.packed, q.scales, q.scale_2)
    with pytest.raises(ValueError, match="scale_2 must be one value"):
        ops.nvfp4_plain_gemv(x, q.packed, q.scales, torch.ones(2))
    with pytest.raises(ValueError, match="contiguous"):
        ops.nvfp4_plain_gemv(x, torch.cat([q.packed, q.packed], 1)[:, ::2], q.scales, q.scale_2)


def _operands(m, k, l_, gen):
    a = torch.randint(0, 256, (l_, m, k // 2), generator=gen, dtype=torch.uint8).permute(1, 2, 0)
    b = torch.randint(0, 256, (l_, 1, k // 2), generator=gen, dtype=torch.uint8).permute(1, 2, 0)
    sfa = torch.randint(0, 0x7f, (l_, m, k // 16), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn).permute(1, 2, 0)
    sfb = torch.randint(0, 0x7f, (l_, 1, k // 16), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn).permute(1, 2, 0)
    return a, b, sfa, sfb


def test_w4a4_cpu_is_the_reference(gen):
    a, b, sfa, sfb = _operands(5, 64, 3, gen)
    c = ops.nvfp4_w4a4_gemv(a, b, sfa, sfb)
    assert c.shape == (5, 1, 3) and c.dtype == torch.float16
    assert torch.equal(c, nvfp4.w4a4_gemv_reference(a, b, sfa, sfb))
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    if fp4 is not None:
        assert torch.equal(ops.nvfp4_w4a4_gemv(a.view(fp4), b.view(fp4), sfa, sfb), c)


def test_w4a4_rejects_bad_input(gen):
    a, b, sfa, sfb = _operands(5, 64, 3, gen)
    with pytest.raises(ValueError, match="b must be"):
        ops.nvfp4_w4a4_gemv(a, a, sfa, sfb)
    with pytest.raises(ValueError, match="sfa / sfb"):
        ops.nvfp4_w4a4_gemv(a, b, sfa[:, :2], sfb)
    with pytest.raises(TypeError, match="a must have dtype"):
        ops.nvfp4_w4a4_gemv(a.view(torch.int8), b, sfa, sfb)
    with pytest.raises(TypeError, match="sfa must have dtype"):
        ops.nvfp4_w4a4_gemv(a, b, sfa.view(torch.uint8), sfb)
    with pytest.raises(ValueError, match="multiple of 32"):
        ops.nvfp4_w4a4_gemv(a[:, :8], b[:, :8], sfa[:, :1], sfb[:, :1])
    # any strides: an [M, K/2, L]-contiguous a (not K-major) gives the same result
    assert torch.equal(ops.nvfp4_w4a4_gemv(a.contiguous(), b, sfa, sfb), ops.nvfp4_w4a4_gemv(a, b, sfa, sfb))
    with pytest.raises(ValueError, match="3-D"):
        ops.nvfp4_w4a4_gemv(a[:, :, 0], b, sfa, sfb)


def test_quantize_act_cpu_is_the_reference(gen):
    x = torch.randn(4, 64, generator=gen).half()
    codes, scales = ops.nvfp4_quantize_act(x, torch.tensor(0.5))
    rc, rs = nvfp4.quantize_blocks(x, 0.5)
    assert torch.equal(codes, rc) and torch.equal(scales.view(torch.uint8), rs.view(torch.uint8))
    with pytest.raises(ValueError, match="multiple of 16"):
        ops.nvfp4_quantize_act(torch.randn(2, 40), torch.tensor(1.0))
    with pytest.raises(ValueError, match="scale_2 must be one value"):
        ops.nvfp4_quantize_act(x, torch.ones(2))
    with pytest.raises(TypeError, match="x must have dtype"):
        ops.nvfp4_quantize_act(x.to(torch.int32), torch.tensor(1.0))


def test_ops_trace_with_fake_tensors(gen):
    """register_fake: shapes and dtypes without running (torch.compile / meta)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = lowbit.quantize_nvfp4(torch.randn(8, 64, generator=gen))
    a, b, sfa, sfb = _operands(5, 64, 3, gen)
    with FakeTensorMode(allow_non_fake_inputs=True):
        y = ops.nvfp4_plain_gemv(torch.randn(2, 64), q.packed, q.scales, q.scale_2)
        c = ops.nvfp4_w4a4_gemv(a, b, sfa, sfb)
        codes, scales = ops.nvfp4_quantize_act(torch.randn(2, 64), torch.tensor(1.0))
    assert y.shape == (2, 8) and c.shape == (5, 1, 3) and c.dtype == torch.float16
    assert codes.shape == (2, 32) and scales.shape == (2, 4) and scales.dtype == torch.float8_e4m3fn


def test_nvfp4_dispatch_rule():
    """Which path nvfp4_linear takes, from (device, dtype, M, K) only."""
    from lowbit import dispatch

    class FakeCuda:  # the rule reads is_cuda / dtype / shape / device only
        def __init__(self, m, dtype=torch.float16):
            self.shape, self.dtype, self.is_cuda, self.device = (m, 4096), dtype, True, torch.device("cuda", 0)

    assert dispatch.nvfp4_path(torch.zeros(4, 64), 8, 64) == "reference"  # CPU
    assert dispatch.nvfp4_path(FakeCuda(1), 4096, 4096) == "gemv"
    assert dispatch.nvfp4_path(FakeCuda(8, torch.bfloat16), 4096, 4096) == "gemv"
    assert dispatch.nvfp4_path(FakeCuda(8, torch.float32), 4096, 4096) == "reference"
    assert dispatch.nvfp4_path(FakeCuda(1), 4096, 4096 + 16) == "reference"  # K % 32 != 0
    assert dispatch.nvfp4_path(FakeCuda(0), 4096, 4096) == "reference"


def test_nvfp4_linear_cpu_matches_reference(gen):
    q = lowbit.quantize_nvfp4(torch.randn(40, 64, generator=gen))
    x = torch.randn(2, 3, 64, generator=gen)
    y = lowbit.nvfp4_linear(x, q)
    assert y.shape == (2, 3, 40) and torch.equal(y, nvfp4.linear_reference(x.reshape(-1, 64), q).reshape(2, 3, 40))


def test_nvfp4_grouped_cpu_reference_and_checks(gen):
    w = torch.randn(3, 20, 64, generator=gen)
    experts = lowbit.quantize_nvfp4_experts(w)
    x = torch.randn(7, 64, generator=gen)
    off = torch.tensor([0, 2, 2, 7])
    y = lowbit.nvfp4_grouped_linear(x, off, experts)
    for e, (a, b) in enumerate(zip(off[:-1].tolist(), off[1:].tolist())):
        assert torch.equal(y[a:b], nvfp4.linear_reference(x[a:b], experts.weight(e)))
        assert torch.equal(experts.weight(e).packed, lowbit.quantize_nvfp4(w[e]).packed)
    with pytest.raises(ValueError, match="expert_offsets must rise"):
        lowbit.nvfp4_grouped_linear(x, torch.tensor([0, 3, 2, 7]), experts)
    with pytest.raises(ValueError, match=r"expert_offsets must have E \+ 1 = 4 entries"):
        lowbit.nvfp4_grouped_linear(x, torch.tensor([0, 7]), experts)
    with pytest.raises(TypeError, match="NvFp4Experts"):
        lowbit.nvfp4_grouped_linear(x, off, [experts.weight(0)])


def test_nvfp4_grouped_gemm_op_cpu_is_reference_and_checks(gen):
    """The grouped GEMM's op (CUDA: the tensor-core kernel) is the reference on CPU, with the GEMV op's checks."""
    experts = lowbit.quantize_nvfp4_experts(torch.randn(3, 40, 64, generator=gen))
    args = (experts.qweight, experts.qscales, experts.scale_2, 40, 64)
    off = torch.tensor([0, 2, 2, 7])
    x = torch.randn(7, 64, generator=gen)
    assert torch.equal(ops.nvfp4_grouped_gemm(x, off, *args), ops.nvfp4_grouped_reference(x, off, *args))
    assert torch.equal(ops.nvfp4_grouped_gemm(x, off, *args), ops.nvfp4_grouped_gemv(x, off, *args))
    with pytest.raises(ValueError, match="expert_offsets"):
        ops.nvfp4_grouped_gemm(x, off[:3], *args)
    with pytest.raises(ValueError, match="expert_offsets must rise"):
        ops.nvfp4_grouped_gemm(x, torch.tensor([0, 5, 2, 7]), *args)
    with pytest.raises(ValueError, match=r"x must have shape \[tokens, K=64\]"):
        ops.nvfp4_grouped_gemm(x[:, :32].contiguous(), off, *args)


def test_nvfp4_routed_op_cpu_reference_and_checks(gen):
    """The routed GEMV's op on CPU: row r is x row r // rows_per_x times expert ids[r] (the reference, expert by
    expert, fp32), ids outside [0, E) give exact zero rows; swiglu=True takes silu(gate) * up of x [rows, 2 K]; bad input refused."""
    experts = lowbit.quantize_nvfp4_experts(torch.randn(3, 40, 64, generator=gen))
    args = (experts.qweight, experts.qscales, experts.scale_2, 40, 64)
    x = torch.randn(2, 64, generator=gen)
    ids = torch.tensor([2, 0, 3, 2])  # rows_per_x = 2; 3 is a sentinel
    y = ops.nvfp4_routed_gemv(x, ids, *args, 2)
    for r, e in enumerate(ids.tolist()):
        if e >= 3:
            assert torch.equal(y[r], torch.zeros(40))
            continue
        want = nvfp4.linear_reference(x[r // 2:r // 2 + 1], experts.weight(e))[0]
        torch.testing.assert_close(y[r], want, rtol=1e-5, atol=1e-6)  # fp32, rows batched per expert
    gu = torch.randn(4, 128, generator=gen)
    ys = ops.nvfp4_routed_gemv(gu, ids, *args, 1, swiglu=True)
    assert torch.equal(ys, ops.nvfp4_routed_gemv(ops.swiglu_reference(gu), ids, *args, 1))
    with pytest.raises(ValueError, match="route_ids must have"):
        ops.nvfp4_routed_gemv(x, ids[:3], *args, 2)
    with pytest.raises(ValueError, match="rows_per_x must be a positive int"):
        ops.nvfp4_routed_gemv(x, ids, *args, 0)
    with pytest.raises(ValueError, match=r"swiglu=True: x must be \[rows, 2 x K_in = 128\]"):
        ops.nvfp4_routed_gemv(x, ids[:2], *args, 1, swiglu=True)
    with pytest.raises(TypeError, match="route_ids"):
        ops.nvfp4_routed_gemv(x, ids.int(), *args, 2)
