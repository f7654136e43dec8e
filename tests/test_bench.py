"""Benchmark harness, CPU side: CLI parsing, presets, routing, writers on synthetic results."""

import json

import pytest
import torch

from lowbit.bench import cli as bench_cli
from lowbit.bench import report
from lowbit.bench.methods import all_methods, select
from lowbit.bench.presets import PRESETS_FILE, Linear, load_presets, parse_preset, parse_shape
from lowbit.bench.routing import expert_offsets, route
from lowbit.bench.runner import EXPERTS_LAYER, Row
from lowbit.bench.timing import copies_for_cold
from lowbit.cli import main, make_parser


# ----------------------------------------------------------------------------- presets
def test_presets_load_and_validate():
    presets = load_presets()
    for name in ("qwen3-coder-next", "glm-4.7-flash", "llama-3-8b", "llama-3-70b", "quick"):
        assert name in presets and presets[name].linears
    q = presets["qwen3-coder-next"]
    assert (q.moe.experts, q.moe.top_k) == (512, 8)
    assert {(lin.k_in, lin.n) for lin in q.moe.linears} == {(2048, 512), (512, 2048)}
    assert presets["glm-4.7-flash"].moe.top_k == 4
    big = {(lin.k_in, lin.n) for lin in presets["llama-3-70b"].linears}
    assert (8192, 28672) in big and (28672, 8192) in big
    assert PRESETS_FILE.suffix == ".json"  # shapes are data, not code
    # shapes read off transformers' modules (benchmarks/tools/presets_from_configs.py)
    real = {(lin.k_in, lin.n) for lin in presets["real-shapes"].linears}
    assert len(real) >= 12 and (576, 192) in real and (2048, 12288) in real
    assert presets["qwen3-coder-next-hf"].moe.top_k == 10 and presets["glm-4.7-flash-hf"].moe.experts == 64


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"linears": []}, "non-empty list"),
        ({"linears": [{"name": "a", "k_in": 100, "n": 8}]}, "multiple of 32"),
        ({"linears": [{"name": "a", "k_in": 64, "n": 0}]}, "positive integer"),
        ({"linears": [{"name": "a", "k_in": 64}]}, "exactly name, k_in, n"),
        ({"linears": [{"name": "a", "k_in": 64, "n": 8}, {"name": "a", "k_in": 64, "n": 8}]}, "unique"),
        ({"linears": [{"name": "a", "k_in": 64, "n": 8}], "moe": {"experts": 4, "top_k": 5, "linears": [{"name": "e", "k_in": 64, "n": 8}]}}, "top_k"),
    ],
)
def test_bad_presets_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_preset("bad", bad)


def test_parse_shape():
    assert parse_shape("4096x14336") == Linear("4096x14336", 4096, 14336)
    for bad in ("4096", "4096x", "ax4", "100x64"):
        with pytest.raises(ValueError):
            parse_shape(bad)


# ----------------------------------------------------------------------------- routing
@pytest.mark.parametrize("m, experts, top_k", [(1, 512, 8), (16, 512, 8), (64, 64, 4), (3, 8, 8), (0, 8, 2)])
def test_routing_counts_sum(m, experts, top_k, gen):
    counts = route(m, experts, top_k, gen)
    assert counts.shape == (experts,) and counts.dtype == torch.int64
    assert int(counts.sum()) == m * top_k
    assert int(counts.max()) <= m  # a token picks distinct experts
    off = expert_offsets(counts)
    assert off[0] == 0 and off[-1] == m * top_k and (off[1:] >= off[:-1]).all()


def test_routing_rejects_bad_args():
    with pytest.raises(ValueError):
        route(4, 8, 9)
    with pytest.raises(ValueError):
        route(-1, 8, 2)


# ----------------------------------------------------------------------------- CLI parsing
def test_cli_parsing():
    p = make_parser()
    a = p.parse_args(["bench", "--preset", "llama-3-8b", "--shape", "1024x1024", "--m", "1,4", "--methods", "cublas-fp16,lowbit-kbit4", "--quick"])
    assert a.preset == ["llama-3-8b"] and a.shape == ["1024x1024"] and a.m == [1, 4]
    assert a.methods == ["cublas-fp16", "lowbit-kbit4"] and a.quick
    presets = bench_cli._presets(a)
    assert [pr.name for pr in presets] == ["llama-3-8b", "custom"]
    with pytest.raises(SystemExit):
        p.parse_args(["bench", "--m", "0,1"])


def test_cli_default_presets_and_quick():
    p = make_parser()
    names = [pr.name for pr in bench_cli._presets(p.parse_args(["bench"]))]
    assert names == ["qwen3-coder-next", "glm-4.7-flash", "llama-3-8b", "llama-3-70b"]  # the file's "default"
    assert [pr.name for pr in bench_cli._presets(p.parse_args(["bench", "--quick"]))] == ["quick"]


def test_cli_unknown_preset_and_method(capsys):
    assert main(["bench", "--preset", "nope"]) == 2
    assert "unknown preset" in capsys.readouterr().err
    assert main(["bench", "--methods", "nope"]) == 2
    assert "unknown method" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_cli_without_gpu_exits_nonzero(capsys):
    assert main(["bench", "--quick"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_cli_cpu_reference_mode(tmp_path):
    assert main(["bench", "--cpu", "--shape", "64x32", "--m", "1", "--out", str(tmp_path), "--no-plots"]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    methods = {r["method"] for r in data["rows"]}
    assert {"cpu-fp32-linear", "cpu-kbit4-reference"} <= methods
    assert all(r["hot_us"] > 0 for r in data["rows"])


def test_cli_list(capsys):
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    assert "preset qwen3-coder-next" in out and "method torch-int4" in out


def test_methods_table():
    table = all_methods()
    for name in ("cublas-fp16", "cublas-bf16", "torch-int4", "bnb-nf4", "gemlite-a16w4"):
        assert name in table
    assert all(f"lowbit-kbit{b}" in table for b in (2, 3, 4, 5))
    assert all(table[f"lowbit-kbit{b}"].is_lowbit for b in (2, 3, 4, 5))
    assert all(f"lowbit-kbit{b}-{p}" in table for b in (2, 3, 4, 5) for p in ("gemv", "gemm", "dequant"))
    assert not table["cublas-fp16"].is_lowbit
    with pytest.raises(ValueError, match="unknown method"):
        select(["cublas-fp16", "bogus"])


def test_copies_for_cold():
    l2 = 50 * 2**20
    assert copies_for_cold(470 * 2**20, l2) == 2
    assert copies_for_cold(2 * 2**20, l2) == 100
    assert copies_for_cold(2**20, l2) * 2**20 >= 4 * l2
    with pytest.raises(ValueError):
        copies_for_cold(0, l2)


# ----------------------------------------------------------------------------- writers
def _synthetic_rows():
    rows = []
    for m in (1, 4):
        for meth, base in (("cublas-fp16", 10.0), ("lowbit-kbit4", 4.0), ("torch-int4", 6.0)):
            for layer, k, n in (("attn.q", 2048, 4096), ("mlp.down", 5120, 2048)):
                us = base * m**0.1 * (k * n) / 2**23
                rows.append(Row("p", layer, k, n, m, meth, rel_err=1e-3, cold_us=us, hot_us=us * 0.8,
                                read_bytes=k * n, cold_pct=50.0, hot_pct=62.5))
            rows.append(Row("p", EXPERTS_LAYER, 2048, 512, m, meth, cold_us=base * 3, hot_us=base * 2, read_bytes=10**6,
                            cold_pct=40.0, hot_pct=60.0, calls=24, extra={"active_experts": 8}))
    rows.append(Row("p", "attn.q", 2048, 4096, 1, "bnb-nf4", status="FAIL: rel err 0.9 > 0.25"))
    return rows


def test_layer_totals_sum_every_part():
    rows = _synthetic_rows()
    totals = {(t["m"], t["method"]): t for t in report.layer_totals(rows)}
    t = totals[(1, "lowbit-kbit4")]
    parts = [r.cold_us for r in rows if r.m == 1 and r.method == "lowbit-kbit4"]
    assert t["cold_us"] == pytest.approx(sum(parts)) and t["parts"] == 3 and t["calls"] == 26
    assert t["speedup_vs_cublas_fp16"] == pytest.approx(totals[(1, "cublas-fp16")]["cold_us"] / sum(parts))
    assert totals[(1, "bnb-nf4")]["cold_us"] is None  # a failed part: no total


def test_json_roundtrip_and_markdown(tmp_path):
    rows = _synthetic_rows()
    meta = {"command": "lowbit bench --x", "env": {"gpu": "Fake GPU"}, "read_bw": 3.0e12, "copy_bw": 2.9e12}
    report.write_json(tmp_path / "r.json", rows, meta)
    back, meta2 = report.read_json(tmp_path / "r.json")
    assert back == rows and meta2["read_bw"] == 3.0e12
    md = report.markdown(rows, meta)
    assert "lowbit bench --x" in md and "3.000 TB/s" in md
    assert "| p | attn.q 2048x4096 | 1 |" in md
    assert "experts x8 (24 calls)" in md
    assert "FAIL" in md and "Failures (not timed)" in md


def test_plots_written(tmp_path):
    paths = report.write_plots(_synthetic_rows(), tmp_path)
    assert {p.name for p in paths} == {"time_p.png", "bw_p.png"}
    for p in paths:
        assert p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG"


def test_rich_tables_print():
    from io import StringIO

    from rich.console import Console

    buf = StringIO()
    report.print_tables(_synthetic_rows(), Console(file=buf, width=200))
    text = buf.getvalue()
    assert "per-layer totals" in text and "lowbit-kbit4" in text


def test_quick_leaves_out_jit_compiled_peers_unless_named():
    assert "gemlite-a16w4" in bench_cli.SLOW_SETUP
    assert set(bench_cli.SLOW_SETUP) <= set(all_methods())
