"""Tuning cache (lowbit/tuning.py): file format, validation, lookup order; the dense GEMV op on CPU."""

import json

import pytest
import torch

import lowbit
from lowbit import ops, tuning
from lowbit.bench.tune import shapes_for
from lowbit.cli import main as cli_main

CFG = {"rows": 2, "unroll": 2, "tpr": 64, "threads": 256, "prefetch": 1}


def _write(path, gpus):
    path.write_text(json.dumps({"version": 1, "gpus": gpus}))
    return path


def test_round_trip(tmp_path):
    t = {"GPU A": {"fp16": {"m1_n4096_k2048": tuning.GemvConfig(1, 4, 128, 256, 1)},
                   "bf16": {"m4_n10_k8": tuning.GemvConfig(4, 2, 32, 128, 0)}}}
    tuning.save(tmp_path / "t.json", t)
    assert tuning.load(tmp_path / "t.json") == t


def test_missing_file_is_empty(tmp_path):
    assert tuning.load(tmp_path / "none.json") == {}


@pytest.mark.parametrize("gpus, match", [
    ({"G": {"fp32": {}}}, "must map"),
    ({"G": {"fp16": {"m1_n4": CFG}}}, "key"),
    ({"G": {"fp16": {"x1_n4_k8": CFG}}}, "key"),
    ({"G": {"fp16": {"m1_n4_k8": {**CFG, "rows": 3}}}}, "not compiled"),
    ({"G": {"fp16": {"m1_n4_k8": {**CFG, "tpr": 48}}}}, "multiple of 32"),
    ({"G": {"fp16": {"m1_n4_k8": {**CFG, "threads": 1024}}}}, "threads"),
    ({"G": {"fp16": {"m1_n4_k8": {**CFG, "tpr": 256, "threads": 128}}}}, "dividing"),
    ({"G": {"fp16": {"m1_n4_k8": {**CFG, "rows": True}}}}, "integers"),
    ({"G": {"fp16": {"m1_n4_k8": {**CFG, "prefetch": 2}}}}, "prefetch"),
    ({"G": {"fp16": {"m1_n4_k8": {"rows": 1}}}}, "expected"),
])
def test_validation_names_the_entry(tmp_path, gpus, match):
    with pytest.raises(tuning.TuningFileError, match=match):
        tuning.load(_write(tmp_path / "bad.json", gpus))


def test_bad_json_and_version(tmp_path):
    (tmp_path / "a.json").write_text("{nope")
    with pytest.raises(tuning.TuningFileError, match="JSON"):
        tuning.load(tmp_path / "a.json")
    (tmp_path / "b.json").write_text(json.dumps({"version": 99, "gpus": {}}))
    with pytest.raises(tuning.TuningFileError, match="version"):
        tuning.load(tmp_path / "b.json")


def test_shipped_defaults_are_valid_and_compiled():
    shipped = tuning.load(tuning.SHIPPED)
    for per_dtype in shipped.values():
        for entries in per_dtype.values():
            assert all(c in tuning.candidates() for c in entries.values())


def test_user_file_overrides_shipped_and_heuristic_fills_gaps(tmp_path, monkeypatch):
    user = _write(tmp_path / "user.json", {"GPU X": {"fp16": {"m1_n64_k128": {**CFG, "rows": 4, "unroll": 1}}}})
    monkeypatch.setenv("LOWBIT_TUNING_FILE", str(user))
    tuning.reload()
    try:
        cfg, tuned = tuning.lookup("GPU X", torch.float16, 1, 64, 128)
        assert tuned and cfg == tuning.GemvConfig(4, 1, 64, 256, 1)
        cfg, tuned = tuning.lookup("GPU X", torch.bfloat16, 1, 64, 128)
        assert not tuned and cfg == tuning.heuristic(1, 64, 128)
    finally:
        monkeypatch.delenv("LOWBIT_TUNING_FILE")
        tuning.reload()


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [8, 1024, 2048, 8192, 65536])
def test_heuristic_is_a_compiled_config(m, k):
    assert tuning.heuristic(m, 4096, k) in tuning.candidates()


def test_lookup_rejects_other_dtypes():
    with pytest.raises(TypeError, match="float16 and bfloat16"):
        tuning.lookup("G", torch.float32, 1, 8, 8)


def test_tune_shapes_and_cli_errors(capsys):
    shapes = shapes_for(["quick"], ["512x100"])
    assert (4096, 2048) in shapes and (100, 512) in shapes and len(shapes) == len(set(shapes))
    with pytest.raises(ValueError, match="unknown preset"):
        shapes_for(["nope"], None)
    if not torch.cuda.is_available():
        assert cli_main(["tune", "--preset", "quick"]) == 2
        assert "CUDA" in capsys.readouterr().err


# ------------------------------------------------------------------ the op on CPU
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dense_linear_cpu_is_fp32_reference(dtype, gen):
    w = torch.randn(37, 72, generator=gen).to(dtype)
    x = torch.randn(3, 72, generator=gen).to(dtype)
    y = lowbit.dense_linear(x, w)
    assert y.dtype == dtype and torch.equal(y, (x.float() @ w.float().t()).to(dtype))
    x6 = torch.randn(2, 3, 72, generator=gen).to(dtype)  # M = 6 > 4: still the reference on CPU
    assert torch.equal(lowbit.dense_linear(x6, w), (x6.float() @ w.float().t()).to(dtype))


def test_dense_gemv_bad_inputs(gen):
    w = torch.randn(16, 64, generator=gen).half()
    x = torch.randn(2, 64, generator=gen).half()
    with pytest.raises(TypeError, match="dtype"):
        ops.dense_gemv(x.bfloat16(), w)
    with pytest.raises(TypeError, match="dtype"):
        ops.dense_gemv(x.float(), w.float())
    with pytest.raises(ValueError, match="M = 1..4"):
        ops.dense_gemv(torch.randn(5, 64).half(), w)
    with pytest.raises(ValueError, match="K=64"):
        ops.dense_gemv(torch.randn(2, 63).half(), w)
    with pytest.raises(ValueError, match="contiguous"):
        ops.dense_gemv(x, torch.randn(64, 16).half().t())
    with pytest.raises(ValueError, match="2-D"):
        ops.dense_gemv(x, w[0])
    with pytest.raises(ValueError, match=r"\[\.\.\., K=64\]"):
        lowbit.dense_linear(torch.randn(2, 32).half(), w)


def test_dense_gemv_opcheck(gen):
    w = torch.randn(16, 64, generator=gen).half()
    x = torch.randn(2, 64, generator=gen).half()
    torch.library.opcheck(ops.dense_gemv, (x, w))
