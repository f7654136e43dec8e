"""One set of argument checks on every device and path: each bad input is refused with the same message
on the CPU and on a GPU, through the functional API, the modules (whose eager CUDA forward skips the
dispatcher) and the ops (what torch.compile traces). The CUDA cases are marked ``gpu``."""

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import lowbit
from lowbit import ops

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _kbit(gen, device, n=48, k=512, bits=4):
    return lowbit.quantize_kbit(torch.randn(n, k, generator=gen), bits=bits).to(device)


def _x(gen, shape, device, dtype=torch.float16):
    return torch.randn(*shape, generator=gen).to(dtype).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [1, 4, 8, 9, 40])  # every CUDA path: GEMV (1..8), GEMM, dequantize + cuBLAS
def test_kbit_linear_refuses_wrong_k_everywhere(device, rows, gen):
    w = _kbit(gen, device)
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., K_in=512\] to match the weight, got \(%d, 500\)" % rows):
        lowbit.kbit_linear(_x(gen, (rows, 500), device), w)


@pytest.mark.parametrize("device", DEVICES)
def test_kbit_linear_refuses_dtype_and_layout(device, gen):
    w = _kbit(gen, device)
    with pytest.raises(TypeError, match=r"x must have dtype in \(float16, bfloat16, float32\), got int32"):
        lowbit.kbit_linear(torch.ones(1, 512, dtype=torch.int32, device=device), w)
    with pytest.raises(ValueError, match="x must be contiguous"):
        lowbit.kbit_linear(_x(gen, (512, 2), device).t(), w)
    with pytest.raises(ValueError, match="x must have shape"):
        lowbit.kbit_linear(torch.tensor(1.0, device=device), w)


@pytest.mark.gpu
def test_device_mismatch_refused(gen):
    w = _kbit(gen, "cuda")
    with pytest.raises(ValueError, match="x is on cpu but the weight is on cuda"):
        lowbit.kbit_linear(_x(gen, (1, 512), "cpu"), w)
    q = lowbit.quantize_nvfp4(torch.randn(32, 64, generator=gen)).to("cuda")
    with pytest.raises(ValueError, match="x is on cpu but the weight is on cuda"):
        lowbit.nvfp4_linear(_x(gen, (1, 64), "cpu"), q)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [1, 4, 40])
def test_nvfp4_linear_refuses_wrong_k_everywhere(device, rows, gen):
    q = lowbit.quantize_nvfp4(torch.randn(48, 512, generator=gen)).to(device)
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., K=512\] to match the weight, got \(%d, 496\)" % rows):
        lowbit.nvfp4_linear(_x(gen, (rows, 496), device), q)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", ["kbit", "nvfp4", "fused"])
def test_modules_refuse_wrong_k_everywhere(device, module, gen):
    lin = nn.Linear(512, 48, bias=False).to(torch.float16)
    if module == "kbit":
        mod = lowbit.nn.KbitLinear.from_linear(lin, 4)
    elif module == "nvfp4":
        mod = lowbit.nn.NvFp4Linear.from_linear(lin)
    else:
        parent = nn.Module()
        parent.a, parent.b = lin, nn.Linear(512, 16, bias=False).to(torch.float16)
        lowbit.quantize_model(parent, bits=4, fuse=[("a", "b")], progress=False)
        mod = parent.a
    mod = mod.to(device)
    for rows in (1, 3, 12):
        with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., in_features=512\]"):
            mod(_x(gen, (rows, 500), device))


def _experts(gen, device, fmt):
    w = torch.randn(3, 32, 64, generator=gen)
    e = lowbit.quantize_kbit_experts(w, bits=4) if fmt == "kbit" else lowbit.quantize_nvfp4_experts(w)
    if fmt == "kbit":
        return e.to(device), lowbit.kbit_grouped_linear
    return e.to(device), lowbit.nvfp4_grouped_linear


BAD_OFFSETS = [[0, 3, 1, 4], [0, 2, 4, 9], [1, 2, 3, 4], [0, 1, 2, 3]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["kbit", "nvfp4"])
@pytest.mark.parametrize("bad", BAD_OFFSETS, ids=str)
def test_grouped_refuses_bad_host_offsets_everywhere(device, fmt, bad, gen):
    """Offsets from the host are checked on the host, whatever device x is on: the same message."""
    experts, fn = _experts(gen, device, fmt)
    x = _x(gen, (4, 64), device)
    with pytest.raises(ValueError, match=r"expert_offsets must rise from 0 to the row count 4 \(non-decreasing\)"):
        fn(x, torch.tensor(bad), experts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["kbit", "nvfp4"])
def test_grouped_refuses_offsets_metadata(device, fmt, gen):
    experts, fn = _experts(gen, device, fmt)
    x = _x(gen, (4, 64), device)
    with pytest.raises(ValueError, match=r"expert_offsets must have E \+ 1 = 4 entries, got 3"):
        fn(x, torch.tensor([0, 2, 4]), experts)
    with pytest.raises(TypeError, match="expert_offsets must have dtype in \\(int64\\)"):
        fn(x, torch.tensor([0, 1, 2, 4], dtype=torch.int32), experts)
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., K(_in)?=64\]"):
        fn(_x(gen, (4, 60), device), torch.tensor([0, 1, 2, 4]), experts)


@pytest.mark.parametrize("device", DEVICES)
def test_ops_refuse_wrong_k_everywhere(device, gen):
    """The ops (what torch.compile traces; their fake implementations run the same check)."""
    w = _kbit(gen, device, n=32, k=256)
    qw, qa = w.tiled()
    x = _x(gen, (1, 224), device)
    for op in (ops.kbit_gemv, ops.kbit_gemm, ops.kbit_tiled_linear):
        with pytest.raises(ValueError, match=r"x must have shape \[M, K_in=256\]"):
            op(x, qw, qa, w.codebook, w.scale, 4, 32, 256)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fx = mode.from_tensor(x)
        with pytest.raises(ValueError, match=r"x must have shape \[M, K_in=256\]"):
            ops.kbit_gemv(fx, *(mode.from_tensor(t) for t in (qw, qa, w.codebook, w.scale)), 4, 32, 256)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["kbit", "nvfp4"])
def test_grouped_device_offsets_trip_a_device_assertion(fmt):
    """Offsets already on the GPU are checked there: a bad one stops the program with lowbit's message
    (a device-side assertion; run in a subprocess, since it leaves the CUDA context unusable)."""
    code = textwrap.dedent(f"""
        import torch, lowbit
        w = torch.randn(3, 32, 64)
        e = (lowbit.quantize_kbit_experts(w, bits=4) if {fmt!r} == "kbit" else lowbit.quantize_nvfp4_experts(w)).to("cuda")
        fn = lowbit.kbit_grouped_linear if {fmt!r} == "kbit" else lowbit.nvfp4_grouped_linear
        x = torch.randn(4, 64, dtype=torch.float16, device="cuda")
        good = fn(x, torch.tensor([0, 1, 3, 4], device="cuda"), e)
        torch.cuda.synchronize()
        print("GOOD-OK", flush=True)
        y = fn(x, torch.tensor([0, 3, 1, 4], device="cuda"), e)
        torch.cuda.synchronize()
        print("BAD-RETURNED", flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert "GOOD-OK" in out, out
    assert "BAD-RETURNED" not in out and p.returncode != 0, out
    assert "expert_offsets must rise from 0 to the row count 4" in out, out
