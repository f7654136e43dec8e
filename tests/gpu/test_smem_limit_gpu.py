"""Kernels sized by the device's shared memory: the routed down GEMV whose staged activation rows pass it (long
expert rows), and the decode kernels on a part with 99 KB per CTA (sm_86 / sm_89) -- emulated on the H100 by
LOWBIT_SMEM_LIMIT, which lowers the opt-in maximum that the tiled launchers (GEMV, GEMM) size themselves by.

Bound: as kbit_check.BOUND (relative norm error vs the fp64 definition); NaN never passes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lowbit
from lowbit.kernels import tiled
from lowbit.kernels.library import get_library, ptr, stream_of
from lowbit.ops.common import swiglu_reference

from .kbit_check import BOUND, ref, rel

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SMEM_99KB = 101376  # cudaDevAttrMaxSharedMemoryPerBlockOptin of sm_86 / sm_89


@pytest.mark.parametrize("count", [1, 2, 8])
def test_routed_swiglu_with_long_expert_rows(count, gen):
    """Mixtral-sized experts (K_in = 14336): the routed down GEMV stages min(8, routes) activation rows of 28 KB.
    Two fit an H100's 227 KB beside the table; eight do not, and the launcher computes silu(gate) * up first and
    runs the plain routed GEMV -- the same rounding, so the same bits as that path."""
    e_count, n, k_in, dtype = 4, 64, 14336, torch.bfloat16
    ex = lowbit.quantize_kbit_experts(torch.randn(e_count, n, k_in, generator=gen), bits=4).to("cuda")
    qw, qa = ex.tiled()
    args = (qw, qa, ex.codebook, ex.scales, 4, n, k_in)
    ids = torch.randint(0, e_count, (count,), generator=gen).cuda()
    gu = torch.randn(count, 2 * k_in, generator=gen).to(dtype).cuda()
    fits = tiled.routed_act_fits(get_library(), gu.device, 4, e_count, count, k_in)
    if torch.cuda.get_device_properties(0).shared_memory_per_block_optin >= 200 * 1024:  # H100 / H200
        assert fits == (count <= 2)
    assert not (count == 8 and fits)  # 294 KB: no GPU has it
    y = lowbit.ops.kbit_routed_gemv(gu, ids, *args, 1, True)
    assert torch.isfinite(y).all()
    plain = lowbit.ops.kbit_routed_gemv(swiglu_reference(gu), ids, *args, 1, False)
    if not fits:
        assert torch.equal(y, plain)
        lib = get_library()  # the kernel itself cannot take the call: its rows pass the opt-in maximum
        out = torch.empty(count, n, dtype=dtype, device="cuda")
        call = [ptr(gu), ptr(ids), count, 1, ptr(qw), ptr(qa), ptr(ex.codebook), ptr(ex.scales), ptr(out), e_count, n,
                k_in, tiled.split_max_ctas(lib, gu.device, 4, dtype, e_count), tiled.FLAG_ROUTED_SWIGLU, stream_of(gu.device)]
        with pytest.raises(RuntimeError):
            lib.call("kbit_routed_gemv", call, bits=4, dtype=dtype)
    act = swiglu_reference(gu)
    want = torch.cat([ref(act[r:r + 1], ex.expert(int(ids[r]))) for r in range(count)])
    assert rel(y, want) <= BOUND[dtype]


def _run(cmd: list[str], limit: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, LOWBIT_SMEM_LIMIT=str(limit), PYTHONPATH=str(ROOT))
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


_LIMITS = """
import torch, lowbit
from lowbit.kernels import tiled
from lowbit.kernels.library import get_library
lib, dev = get_library(), torch.device("cuda")
pairs = [tiled.swiglu_max_pairs(lib, dev, f) for f in (2, 3, 4, 5, tiled.TiledFormat("nvfp4"))]
bulk = tiled.bulk_ctas(lib, dev, tiled.kbit_format(4), torch.bfloat16, 1, 4096, 4096)
nts = []
for bits in (2, 3, 4, 5):
    q = lowbit.quantize_kbit(torch.randn(256, 512), bits=bits).to("cuda")
    launch = tiled.GemmLauncher(lib, *q.tiled(), q.codebook, q.scale, bits, 256, 512)
    nts.append(launch.plan(torch.bfloat16, 64)[1])
print(*pairs, bulk, *nts)
"""


@pytest.mark.parametrize("limit", [0, SMEM_99KB], ids=["device", "99KB"])
def test_limits_follow_the_device(limit):
    """On an H100 or H200: the SwiGLU epilogue holds 32 tile pairs per CTA, the bulk-copy GEMV takes a one-token
    4096 -> 4096, and the GEMM takes 64 rows in one chunk (8 token tiles). On a 99 KB part: 18 pairs, no room for
    the bulk kernel's ring (the stream-K kernel takes its calls), and the GEMM's x stages for 64 rows do not fit
    beside the table: 32-row chunks at K <= 4, 16-row ones at K = 5 (its 64 KB table)."""
    assert torch.cuda.get_device_properties(0).shared_memory_per_block_optin >= 200 * 1024, "an sm_90 part"
    out = _run([sys.executable, "-c", _LIMITS], limit)
    assert out.returncode == 0, out.stderr[-3000:]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    want = [32] * 5 + [sms] + [8] * 4 if limit == 0 else [18] * 5 + [0, 4, 4, 4, 2]
    assert [int(v) for v in out.stdout.split()] == want, out.stdout


def test_decode_kernels_on_a_99kb_part():
    """The SwiGLU epilogue (kbit and NVFP4), x-staging and routed-module tests, the fused decode layers (eager) and
    the GEMMs at 33-130 rows, with the shared memory of an sm_86 / sm_89 part: every call sizes itself to it (before,
    the SwiGLU epilogue asked for 112 KB at K >= 3 and the GEMM 112-175 KB for 64 rows, and both failed to configure).
    A selection: the whole files take ~3 minutes serially."""
    sel = "swiglu_epilogue or (fused_layers_decode and eager) or shared_x_equals_global_x or experts_module_routed"
    gemm = [f"tests/gpu/test_kbit_gemm_gpu.py::test_gemm_matches_reference[{i}]"
            for i in ("1-64-bfloat16-4", "2-64-bfloat16-5", "1-130-bfloat16-3", "2-33-float16-2")]
    gemm.append("tests/gpu/test_kbit_gemm_gpu.py::test_grouped_dispatch_deterministic_and_graph_replays_new_routing")
    out = _run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "gpu", "-k", sel,
                "tests/gpu/test_layers_gpu.py", "tests/gpu/test_kbit_gemv_gpu.py"], SMEM_99KB)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert " passed" in out.stdout and "failed" not in out.stdout
    out = _run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "gpu", *gemm], SMEM_99KB)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert " passed" in out.stdout and "failed" not in out.stdout
