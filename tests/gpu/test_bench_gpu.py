"""Benchmark harness on a GPU: timing sanity, the correctness gate, the peers' set-up."""

import re

import pytest

from lowbit.bench.methods import Method, all_methods
from lowbit.bench.presets import Linear, Moe
from lowbit.bench.runner import Runner
from lowbit.bench.timing import measure_copy_bandwidth, measure_read_bandwidth

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def read_bw():
    return measure_read_bandwidth(1 << 30, replays=5)


@pytest.mark.timing
def test_bandwidth_probe_plausible(read_bw):
    copy_bw = measure_copy_bandwidth(1 << 29, replays=5)
    print(f"read {read_bw / 1e12:.3f} TB/s, copy {copy_bw / 1e12:.3f} TB/s")
    assert 0.3e12 < read_bw < 10e12 and 0.3e12 < copy_bw < 10e12


@pytest.mark.timing
def test_cublas_cold_not_faster_than_hot(read_bw):
    """4096x4096 fp16 (32 MiB) fits in L2: hot must not be slower than cold."""
    r = Runner([all_methods()["cublas-fp16"]], read_bw, replays=10).linear("t", Linear("q", 4096, 4096), 1, all_methods()["cublas-fp16"])
    print(r)
    assert r.status == "ok"
    assert r.copies >= 2 and r.cold_us >= r.hot_us
    assert 5 < r.cold_pct < 110


@pytest.mark.parametrize("name", ["lowbit-kbit2", "lowbit-kbit4", "lowbit-kbit5", "lowbit-nvfp4", "lowbit-nvfp4-dequant",
                                  "lowbit-nvfp4-gemm", "torch-int4", "cublas-bf16"])
def test_methods_pass_gate_and_time(name, read_bw):
    meth = all_methods()[name]
    r = Runner([meth], read_bw, replays=5).linear("t", Linear("x", 2048, 1536), 2, meth)
    print(r)
    assert r.status == "ok", r.status
    assert r.cold_us > 0 and r.rel_err <= meth.tolerance


def test_broken_method_reported_not_timed(read_bw):
    good = all_methods()["lowbit-kbit4"]
    broken = Method(**{**good.__dict__, "name": "broken", "run": lambda x, q: good.run(x, q) * 1.01})
    r = Runner([broken], read_bw, replays=5).linear("t", Linear("x", 1024, 1024), 1, broken)
    assert r.status.startswith("FAIL") and r.cold_us is None and r.hot_us is None


@pytest.mark.parametrize("name", ["cublas-fp16", "lowbit-nvfp4"])
def test_moe_block_times_all_active_experts(name, read_bw):
    meth = all_methods()[name]
    moe = Moe(64, 4, (Linear("expert.gate", 2048, 512), Linear("expert.down", 512, 2048)))
    r = Runner([meth], read_bw, replays=5).moe("t", moe, 4, meth)
    print(r)
    assert r.status == "ok"
    per_expert = meth.run_grouped is None  # cuBLAS: one call per active expert and projection
    assert r.calls == (r.extra["active_experts"] * 2 if per_expert else 2) and r.cold_us > 0


def test_grouped_crossover_times_whole_blocks():
    """`lowbit tune --kbit-crossover`'s grouped part times the expert block on both sides (the routed GEMV at
    decode sizes, the sorted grouped GEMM) and returns one of the swept means (or twice the largest)."""
    from lowbit.bench import crossover

    lines = []
    best = crossover.measure_grouped(rows_per_expert=(0.5, 4.0), block=(16, 256, 128, 2), replays=2, log=lines.append)
    assert best in (0.5, 4.0, 8.0)
    assert len(lines) == 3 and "GEMV block" in lines[0] and "GEMM block" in lines[0]
    for line in lines[:2]:
        vals = [float(v) for v in re.findall(r"block +([0-9.]+) us", line)]
        assert len(vals) == 2 and all(0 < v < 1e5 for v in vals), line
