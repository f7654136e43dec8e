"""Tensor parallelism through the transformers quantizer (lowbit.hf.tp), on the CPU: 2 processes on the gloo
backend, the way torchrun starts them. The sharded model (quantized while loading, or a saved lowbit model)
must give the unsharded logits up to the all-reduce's summation order: fp32, relative error <= 1e-5 (the
two ranks' partial sums are added in another order than one rank's dot products; measured ~4e-7)."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch

from .tiny_models import build, decode_logits

transformers = pytest.importorskip("transformers")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)
import torch.multiprocessing as mp  # noqa: E402

BOUND = 1e-5
WORLD = 2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, cases: list[str], paths: dict, out: str) -> None:
    """One rank: every case in turn (one process group, one import of torch and transformers for all of them)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    results = {}
    try:
        for case in cases:
            try:
                results[case] = _case(case, rank, paths, out)
            except Exception:  # noqa: BLE001 -- reported by the case's test
                import traceback

                results[case] = {"exception": traceback.format_exc()}
        with open(f"{out}.{rank}", "w") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


def _case(case: str, rank: int, paths: dict, out: str) -> dict:
    from transformers.distributed import DistributedConfig

    import lowbit
    from lowbit.hf import LowbitConfig

    tp = {"distributed_config": DistributedConfig(tp_size=WORLD), "dtype": torch.float32}
    result = {}
    if case == "dense_head":  # shard_model switches a bf16 head to lowbit's dense GEMV before splitting it
        from lowbit.hf import head as hf_head
        from lowbit.hf import tp as hf_tp

        m = transformers.AutoModelForCausalLM.from_pretrained(paths["dense"], dtype=torch.float32)
        lowbit.quantize_model(m, progress=False)
        ids = torch.tensor([[3, 17, 99, 250, 7, 64, 1, 120, 45, 8]])
        with torch.no_grad():
            want = m(ids).logits
        real = hf_head.refusal
        # as if a bf16 head on a GPU (this one is fp32 on the CPU): every other reason stands, so a split head, with
        # its TP forward, is still refused
        gpu_only = ("its weight is on", "its weight is torch.float32")
        hf_head.refusal = lambda h: None if (r := real(h)) is not None and r.startswith(gpu_only) else r
        try:
            _, mesh = hf_tp.setup("cpu")
            _, plain = hf_tp.shard_model(m, mesh)
        finally:
            hf_head.refusal = real
        with torch.no_grad():
            got = m(ids).logits  # on the CPU its forward is nn.Linear's: the gathered slices
        return {"head": [type(m.lm_head).__name__, m.lm_head.out_features], "plain": plain,
                "err": ((got - want).norm() / want.norm()).item()}
    if case == "localize_head":  # a head transformers split while loading becomes local rows (LowbitDenseHead)
        from lowbit.hf import head as hf_head
        from lowbit.hf import tp as hf_tp

        m = transformers.AutoModelForCausalLM.from_pretrained(paths["dense"], quantization_config=LowbitConfig(), **tp)
        ids = torch.tensor([[3, 17, 99, 250, 7, 64, 1, 120, 45, 8]])
        with torch.no_grad():
            want = m(ids).logits
        before = [type(m.lm_head).__name__, type(m.lm_head.weight.data).__name__]
        real = hf_head.refusal
        gpu_only = ("its weight is on", "its weight is torch.float32")  # as if a bf16 head on a GPU
        hf_head.refusal = lambda h: None if (r := real(h)) is not None and r.startswith(gpu_only) else r
        try:
            done = hf_tp.localize_head(m)
            again = hf_tp.localize_head(m)  # nothing left to do
        finally:
            hf_head.refusal = real
        with torch.no_grad():
            got = m(ids).logits  # on the CPU its forward is nn.Linear's, on the local rows, then gathered
        return {"before": before, "done": done, "again": again, "err": ((got - want).norm() / want.norm()).item(),
                "after": [type(m.lm_head).__name__, type(m.lm_head.weight.data).__name__, m.lm_head.out_features]}
    if case == "auto":  # the default all-reduce on CPU ranks: decided once with both ranks, NCCL's path (gloo here)
        from lowbit.hf import tp as hf_tp

        hf_tp._auto.clear()
        hf_tp.set_allreduce("auto")
        t = torch.full((3,), float(rank + 1))
        total = hf_tp.all_reduce(t, dist.group.WORLD)  # the first use decides
        return {"sum": total.tolist(), "decided": dict(hf_tp._auto),
                "again": hf_tp.resolve_allreduce(dist.group.WORLD, torch.device("cpu"))}
    if case in ("fused_decode_compiled", "fused_decode_separate"):
        return _fused_decode(paths["wide"], tp, kinds=("nccl",), compiled=case.endswith("compiled"),
                             fuse=case.endswith("compiled"))
    if case.startswith("fused_decode"):
        return _fused_decode(paths["wide"], tp, fmt="nvfp4" if case.endswith("nvfp4") else "kbit")
    if case in ("kbit", "nvfp4", "head", "moe", "moe_nvfp4"):
        opts = ({"bits_for": {"lm_head": 4}} if case == "head" else {} if case == "moe"
                else {"format": "nvfp4"} if case == "moe_nvfp4" else {"format": case})
        src = paths["moe" if case.startswith("moe") else "dense"]
        m = transformers.AutoModelForCausalLM.from_pretrained(src, quantization_config=LowbitConfig(**opts), **tp)
        ref = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
        lowbit.quantize_model(ref, progress=False, **opts)
    elif case in ("saved", "nvfp4_saved", "moe_saved", "moe_nvfp4_saved"):
        m = transformers.AutoModelForCausalLM.from_pretrained(paths[case], **tp)
        ref = transformers.AutoModelForCausalLM.from_pretrained(paths[case], dtype=torch.float32)
    else:  # refusals
        plan = {f"model.{k}": v for k, v in transformers.LlamaConfig().base_model_tp_plan.items()}
        plan["model.layers.*.mlp.down_proj"] = "rowwise_rep"  # a split lowbit does not make
        custom = {"distributed_config": DistributedConfig(tp_size=WORLD, tp_plan=plan), "dtype": torch.float32}
        for what, path, cfg, kw in (("off_block", paths["odd"], LowbitConfig(), tp),
                                    ("experts_off_block", paths["moe_odd"], LowbitConfig(), tp),
                                    ("sbvr", paths["moe"], LowbitConfig(format="sbvr"), tp),
                                    ("style", paths["dense"], LowbitConfig(), custom)):
            try:
                transformers.AutoModelForCausalLM.from_pretrained(path, quantization_config=cfg, **kw)
                result[what] = "no error"
            except (ValueError, NotImplementedError) as e:
                result[what] = f"{type(e).__name__}: {e}"
        return result
    ids = torch.tensor([[3, 17, 99, 250, 7, 64, 1, 120, 45, 8]])
    with torch.no_grad():
        y, r = m(ids).logits, ref(ids).logits
    layer = m.model.layers[0]
    result = {"err": ((y - r).norm() / r.norm()).item(), "finite": bool(torch.isfinite(y).all()),
              "head": [type(m.lm_head).__name__, m.lm_head.out_features, list(y.shape)],
              "qkv": [layer.self_attn.q_proj.out_features, layer.self_attn.k_proj.out_features]}
    try:
        m.save_pretrained(f"{out}.{case}.saved{rank}")
        result["save"] = "no error"
    except NotImplementedError as e:
        result["save"] = str(e)
    result["read"] = getattr(m, "lowbit_tp_read", None)
    if case.startswith("moe"):
        ex = layer.mlp.experts
        result["experts"] = [type(ex).__name__, ex.intermediate_dim, type(ref.model.layers[0].mlp.experts).__name__]
    else:
        result["down_in"] = layer.mlp.down_proj.in_features
    return result


def _fused_decode(src: str, tp: dict, device: str = "cpu", kinds=("nccl", "dtensor"), fmt: str = "kbit",
                  compiled: bool = False, fuse: bool = True) -> dict:
    """The fused decoder layer (lowbit.hf.layers; on the CPU through the ops' reference) on this rank's parts, in bf16,
    for each all-reduce kind: its decode logits against the whole model's fused step and against the split model's
    own layers, how many GEMV calls it made and how many of them carried the residual, how many row-split sums.
    ``compiled``: the split model's fused steps through torch.compile (fullgraph); ``fuse=False``: q, k, v, gate and
    up quantized as modules of their own."""
    import lowbit
    from lowbit import dispatch
    from lowbit.hf import LowbitConfig
    from lowbit.hf import attention as hf_attention
    from lowbit.hf import layers as hf_layers
    from lowbit.hf import tp as hf_tp

    kw = {**tp, "dtype": torch.bfloat16}
    cfg = LowbitConfig(format=fmt, fuse=fuse)
    split = transformers.AutoModelForCausalLM.from_pretrained(src, quantization_config=cfg, **kw)
    whole = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, device_map=device)
    lowbit.quantize_model(whole, progress=False, format=fmt, fuse=fuse)
    for m in (split, whole):
        m.set_attn_implementation("sdpa")
        hf_attention.use_gqa_sdpa(m)
        hf_attention.use_fused_decode_attention(m)
        hf_layers.use_fused_decode_layers(m)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 320, (2, 6), generator=g).to(device)
    steps = torch.randint(0, 320, (3, 2, 1), generator=g).to(device)
    result = {}
    real_op, real_sum = dispatch.gemv_epilogue_op, hf_layers._row_sum
    hf_layers.CPU_REFERENCE = device == "cpu"
    try:
        want = decode_logits(whole, ids, steps)
        hf_layers.FUSED = False
        own = decode_logits(split, ids, steps)
        hf_layers.FUSED = True
        spread = (want.amax() - want.amin()).item()
        for kind in kinds:
            hf_tp.set_allreduce(kind)
            calls, sums = [], []
            dispatch.gemv_epilogue_op = (lambda *a, c=calls, **k:
                                         c.append(k.get("residual") is not None) or real_op(*a, **k))
            hf_layers._row_sum = lambda *a, s=sums: s.append(1) or real_sum(*a)
            torch._dynamo.reset()
            got = decode_logits(split, ids, steps, compiled)
            dispatch.gemv_epilogue_op, hf_layers._row_sum = real_op, real_sum
            result[kind] = {"finite": bool(torch.isfinite(got).all()), "calls": len(calls), "with_residual": sum(calls),
                            "sums": len(sums), "vs_whole": (got - want).abs().max().item() / spread,
                            "vs_own": (got - own).abs().max().item() / spread}
        result["own_vs_whole"] = (own - want).abs().max().item() / spread
        result["modules"] = sorted({type(m.model.layers[0].mlp.down_proj).__name__ for m in (split, whole)})
    finally:
        dispatch.gemv_epilogue_op, hf_layers._row_sum = real_op, real_sum
        hf_layers.FUSED, hf_layers.CPU_REFERENCE = True, False
        hf_tp.set_allreduce("nccl")
    return result


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("tp")
    build("llama", 5, inter=256).save_pretrained(d / "dense")
    build("llama", 5, inter=224).save_pretrained(d / "odd")  # down_proj: K = 224 -> 2 x 112, not whole blocks
    build("qwen3_moe", 5, moe_inter=128).save_pretrained(d / "moe")  # experts' I = 128 -> 2 x 64: whole blocks
    build("qwen3_moe", 5).save_pretrained(d / "moe_odd")  # I = 96 -> 2 x 48: not
    # head dim 64, which the CUDA decode attention is compiled for (32 is not): the fused decode step's model
    build("llama", 5, hidden=256, inter=512).save_pretrained(d / "wide")
    from lowbit.hf import LowbitConfig

    for src, dst, cfg in (("dense", "saved", LowbitConfig()), ("moe", "moe_saved", LowbitConfig()),
                          ("dense", "nvfp4_saved", LowbitConfig(format="nvfp4")),
                          ("moe", "moe_nvfp4_saved", LowbitConfig(format="nvfp4"))):
        q = transformers.AutoModelForCausalLM.from_pretrained(d / src, dtype=torch.float32, quantization_config=cfg)
        q.save_pretrained(d / dst)
    return {k: str(d / k) for k in ("dense", "odd", "moe", "moe_odd", "saved", "moe_saved", "nvfp4_saved", "moe_nvfp4_saved",
                                    "wide")}


FUSED_CASES = ["fused_decode", "fused_decode_nvfp4", "fused_decode_compiled", "fused_decode_separate"]
CASES = ["kbit", "nvfp4", "saved", "nvfp4_saved", "head", "moe", "moe_saved", "moe_nvfp4", "moe_nvfp4_saved", "refusals",
         "auto", "dense_head",
         "localize_head", *FUSED_CASES]


@pytest.fixture(scope="module")
def ranks(paths, tmp_path_factory):
    """Every case's result on each rank, from one run of 2 processes (spawning them costs more than a case)."""
    out = str(tmp_path_factory.mktemp("tp_results") / "result")
    mp.spawn(_worker, args=(_port(), CASES, paths, out), nprocs=WORLD)
    return [json.loads(open(f"{out}.{r}").read()) for r in range(WORLD)]


def _run(case, ranks) -> list[dict]:
    results = [r[case] for r in ranks]
    for res in results:
        assert "exception" not in res, res["exception"]
    return results


@pytest.mark.parametrize("case", ["kbit", "nvfp4", "saved", "nvfp4_saved", "head"])
def test_sharded_forward_equals_unsharded(case, ranks):
    """Quantized while loading under TP (kbit, NVFP4; with the LM head in kbit4, split by vocabulary rows and
    its output gathered), or a saved lowbit model loaded under TP: each rank holds half of q|k|v's rows
    (fused: half of each projection) and half of down's columns, and the logits are the unsharded model's."""
    for res in _run(case, ranks):
        assert res["finite"] and res["err"] <= BOUND, res
        assert res["down_in"] == 256 // WORLD
        assert res["qkv"] == [128 // WORLD, 64 // WORLD]
        if case == "head":
            assert res["head"] == ["KbitLinear", 320 // WORLD, [1, 10, 320]], res
        if case == "saved":  # the split weights' slices only: half of the colwise ones; the rowwise ones here have
            # 128 / 256 columns, one 256-column group, so a rank reads them whole: 96 of 144 K weights
            assert 0 < res["read"]["read_bytes"] <= 0.7 * res["read"]["stored_bytes"], res
        if case == "nvfp4_saved":  # NVFP4 is stored row-major: a rank reads exactly its half of every split weight
            assert 0 < res["read"]["read_bytes"] == res["read"]["stored_bytes"] // WORLD, res


@pytest.mark.parametrize("case", ["moe", "moe_saved", "moe_nvfp4", "moe_nvfp4_saved"])
def test_sharded_moe_forward_equals_unsharded(case, ranks):
    """A Qwen3-MoE quantized while loading under TP (kbit, NVFP4), or saved and loaded under TP (each rank reading its
    slices of the split weights): each rank's expert block holds every expert's half of the intermediate features (gate and up rows, down columns), the ranks' partial
    outputs are summed, and the logits are the unsharded model's."""
    for res in _run(case, ranks):
        assert res["finite"] and res["err"] <= BOUND, res
        cls = "NvFp4MoeExperts" if "nvfp4" in case else "KbitMoeExperts"
        assert res["experts"] == [cls, 128 // WORLD, cls], res
        assert "split for tensor parallelism" in res["save"], res  # one rank's parts are no checkpoint
        assert res["qkv"] == [4 * 32 // WORLD, 2 * 32 // WORLD]
        if case.endswith("saved"):  # slices of the split weights: gate|up rows and q|k|v rows halved; down and o
            # (128 columns, one 256-column group) read whole
            assert 0 < res["read"]["read_bytes"] <= 0.8 * res["read"]["stored_bytes"], res


@pytest.mark.parametrize("case", FUSED_CASES)
def test_fused_layers_decode_the_split_model(case, ranks):
    """The fused decoder layer on each rank's kbit or NVFP4 parts (bf16, hidden 256, 2 layers, 3 decode steps of 2
    sequences; kbit also compiled with fullgraph, which traces the split's checks, and with each projection a
    module of its own): every projection runs as an epilogue GEMV (layer 0: o, gate|up, down; layer 1: q|k|v too),
    the residual goes into rank 0's o_proj and down_proj only, their outputs are summed over the ranks, and the
    logits match the whole model's fused step and the split model's own layers within bf16 rounding of a few ops
    (bound: 2% of the logits' spread, as tests/test_layers.py)."""
    results = _run(case, ranks)
    for rank, res in enumerate(results):
        assert res["modules"] == ["NvFp4Linear" if case.endswith("nvfp4") else "KbitLinear"], res
        got = res["nccl"]
        per_step = 11 if case.endswith("separate") else 7  # separate q, k, v, gate, up: 2 + 2 more GEMVs per layer
        assert got["finite"] and got["calls"] == 3 * per_step and got["sums"] == 3 * 4, res
        assert got["with_residual"] == (3 * 4 if rank == 0 else 0), res
        assert got["vs_whole"] <= 0.02 and got["vs_own"] <= 0.02 and res["own_vs_whole"] <= 0.02, res
        if "dtensor" not in res:  # (the compiled case: NCCL only)
            continue
        # transformers' own all-reduce (a DTensor redistribute) keeps the layers' own forward
        assert res["dtensor"]["calls"] == 0 and res["dtensor"]["sums"] == 0 and res["dtensor"]["vs_own"] == 0, res


def test_splits_lowbit_cannot_take_are_refused(ranks):
    for res in _run("refusals", ranks):
        assert res["off_block"].startswith("ValueError") and "whole 32-element blocks" in res["off_block"], res
        assert res["experts_off_block"].startswith("ValueError") and "whole 32-element blocks" in res["experts_off_block"], res
        assert res["sbvr"].startswith("NotImplementedError") and "does not split for tensor" in res["sbvr"], res
        assert res["style"].startswith("NotImplementedError") and "'rowwise_rep'" in res["style"], res


@pytest.mark.parametrize("model,split", [("tiny-llama", 8), ("tiny-qwen3-moe", 6)])
def test_generate_under_torchrun(model, split, tmp_path):
    """`torchrun --nproc-per-node 2 -m lowbit generate` as a user types it: every rank quantizes, keeps its part
    of each split module (MoE: every expert's half of the intermediate features), and rank 0 alone prints."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-port", str(_port()),
           "-m", "lowbit", "generate", "--model", f"random:{model}", "--device", "cpu", "--max-new-tokens", "4"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.count(f"tensor parallel over 2 ranks: {split} quantized modules split") == 1, r.stdout
    assert "kbit4 TP=2" in r.stdout
    assert "all-reduce: nccl (auto)" in r.stdout, r.stdout  # the default, decided with both (CPU) ranks


def test_generate_under_torchrun_refuses_what_it_cannot_split(monkeypatch):
    import argparse

    from lowbit.errors import UsageError
    from lowbit.hf import generate as gen_mod

    monkeypatch.setenv("WORLD_SIZE", "2")
    p = argparse.ArgumentParser()
    gen_mod.add_parser(p.add_subparsers())
    for extra in (["--format", "kbit,nvfp4"], ["--save", "somewhere"], ["--method", "gptq"]):
        args = p.parse_args(["generate", "--model", "random:tiny-llama", *extra])
        with pytest.raises(UsageError, match="torchrun"):
            gen_mod.check_args(args)


def test_tp_allreduce_option_needs_torchrun_and_a_gpu_for_symm_mem(monkeypatch):
    import argparse

    from lowbit.errors import UsageError
    from lowbit.hf import generate as gen_mod

    p = argparse.ArgumentParser()
    gen_mod.add_parser(p.add_subparsers())
    args = p.parse_args(["generate", "--model", "random:tiny-llama", "--tp-allreduce", "nccl"])
    with pytest.raises(UsageError, match="torchrun"):
        gen_mod.check_args(args)
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = p.parse_args(["generate", "--model", "random:tiny-llama", "--device", "cpu", "--tp-allreduce", "symm-mem"])
    with pytest.raises(UsageError, match="needs GPUs"):
        gen_mod.check_args(args)
    if not torch.cuda.is_available():  # the default device is the CPU then
        args = p.parse_args(["generate", "--model", "random:tiny-llama", "--tp-allreduce", "symm-mem"])
        with pytest.raises(UsageError, match="needs GPUs"):
            gen_mod.check_args(args)
    with pytest.raises(SystemExit):  # argparse: not one of the kinds
        p.parse_args(["generate", "--tp-allreduce", "mpi"])


def test_auto_allreduce_is_decided_once_with_every_rank(ranks):
    """``auto`` (the default) on CPU ranks: the first all-reduce decides it with both ranks (NCCL's path, gloo
    here), sums right, and the choice is kept for the group."""
    for res in _run("auto", ranks):
        assert res["sum"] == [3.0, 3.0, 3.0], res
        assert list(res["decided"].values()) == ["nccl"] and res["again"] == "nccl", res


def test_shard_model_keeps_the_dense_gemv_head(ranks):
    """A bf16 head that a decode would run through lowbit's dense GEMV is switched before it is split (a split head
    keeps its TP forward and could not be switched after): each rank's half keeps the class, and the gathered
    logits are the unsplit model's."""
    for res in _run("dense_head", ranks):
        assert res["head"] == ["LowbitDenseHead", 320 // WORLD] and res["plain"] == 1, res
        assert res["err"] <= BOUND, res


def test_a_head_transformers_split_becomes_local_rows(ranks):
    """A bf16 head that transformers split while loading (DTensor rows, its own forward: the dense GEMV must refuse
    it) becomes this rank's rows as a local LowbitDenseHead under lowbit's gathering style; the logits are
    unchanged, and a second call finds nothing to do."""
    for res in _run("localize_head", ranks):
        assert res["before"] == ["Linear", "DTensor"], res
        assert res["done"] and not res["again"], res
        assert res["after"] == ["LowbitDenseHead", "Tensor", 320 // WORLD], res
        assert res["err"] <= BOUND, res


def test_auto_allreduce_takes_symm_mem_only_where_every_rank_can():
    from lowbit.hf.tp import choose_allreduce

    gpu = {"host": "a", "cuda": True, "symm_mem": True, "p2p": True}
    assert choose_allreduce([gpu, dict(gpu)]) == "symm-mem"
    assert choose_allreduce([gpu]) == "nccl"  # one rank: nothing to exchange
    for odd in ({"p2p": False}, {"host": "b"}, {"cuda": False}, {"symm_mem": False}):
        assert choose_allreduce([gpu, {**gpu, **odd}]) == "nccl", odd
    assert choose_allreduce([]) == "nccl"


def test_allreduce_kinds_are_checked(monkeypatch):
    from lowbit.hf import tp

    with pytest.raises(ValueError, match="auto, nccl, symm-mem, dtensor"):
        tp.set_allreduce("ring")
    monkeypatch.setattr(tp, "_allreduce", "ring")  # as a bad $LOWBIT_TP_ALLREDUCE leaves it
    with pytest.raises(ValueError, match="LOWBIT_TP_ALLREDUCE"):
        tp.allreduce_kind()
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        tp.all_reduce(torch.ones(4), group=None, kind="symm-mem")


def test_inductor_symm_mem_note_is_dropped_and_nothing_else():
    """lowbit's symm-mem buffer is allocated outside the compiled graph, so inductor's lowering warns at every call
    site that it could not allocate its own; that one message is dropped, the logger's others are kept."""
    import logging

    from lowbit.hf import tp

    log = logging.getLogger("torch._inductor.comm_lowering")
    tp.quiet_inductor_symm_mem()
    tp.quiet_inductor_symm_mem()  # idempotent: one filter
    assert sum(isinstance(f, tp._DropMessage) for f in log.filters) == 1
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    log.addHandler(handler)  # (torch's loggers do not propagate to the root logger)
    try:
        log.warning("%s for symm_mem operation; ensure ...", tp._SYMM_MEM_NOTE)
        log.warning("something else went wrong")
    finally:
        log.removeHandler(handler)
    assert seen == ["something else went wrong"]


def _tp_scaling(tmp_path, *extra) -> dict:
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "tp_scaling.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-port", str(_port()),
           str(script), "--model", "random:tiny-llama", "--device", "cpu", "--max-new-tokens", "5",
           "--out", str(tmp_path), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "rows.json").read_text())
    assert "errors" not in res["info"], res["info"]["errors"]
    return res


def test_tp_scaling_benchmark_on_cpu(tmp_path):
    """benchmarks/tp_scaling.py as the device runs it, on 2 gloo processes: the tiny Llama decoded whole (TP = 1),
    then split (the bf16 LM head by vocabulary rows too) with each CPU all-reduce kind, through the fused decode
    attention step (each rank's heads): the same logits within the fp32 bound, exactly the one-process emulation
    of the split's summation order, and the same greedy tokens."""
    res = _tp_scaling(tmp_path)
    info, rows = res["info"], res["rows"]
    assert info["fused_attention_layers"] == 2 and info["split_modules"] == 8 and info["split_plain_linears"] == 1
    assert info["whole_unchanged_after_fp32"] and info["logits"]["emulated_split_vs_whole"] <= BOUND
    for kind in ("auto", "nccl", "dtensor"):
        got = info["logits_vs_tp1"][kind]
        assert got["finite"] and got["rel_error"] <= BOUND and got["top1"] == 1.0, got
        assert got["vs_emulated_split"] <= 1e-6, got  # the same partial sums, added in the same order
    split = [row for row in rows if "TP=2" in row["variant"]]
    kinds = ("auto", "nccl", "dtensor")
    assert {(row["allreduce"], row["batch"]) for row in split} == {(k, b) for k in kinds for b in (1, 4)}
    assert {row.get("allreduce_used") for row in split if row["allreduce"] == "auto"} == {"nccl"}  # CPU ranks
    for row in split:
        assert row["same_tokens_as_tp1"] == 5 and row["tokens_per_s"] > 0, row  # every one of the 5 tokens


def test_tp_from_pretrained_benchmark_on_cpu(tmp_path):
    """benchmarks/tools/tp_from_pretrained.py on 2 gloo processes: the tiny Llama written by rank 0, loaded with
    LowbitConfig whole (TP = 1) and with DistributedConfig(tp_size=2), both decoded: a row per load, the split one
    on NCCL's path (auto on CPU ranks), and the same greedy tokens from the same prompt."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "tools" / "tp_from_pretrained.py"
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-port", str(_port()),
           str(script), "--model", "random:tiny-llama", "--dir", str(tmp_path / "src"), "--device", "cpu",
           "--max-new-tokens", "4", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    one, split = json.loads(out.read_text())
    assert one["variant"] == "kbit4 TP=1" and split["variant"] == "kbit4 TP=2 from_pretrained"
    assert one["allreduce"] is None and split["allreduce"] == ["nccl"]
    assert split["first_tokens"] == one["first_tokens"] and len(one["first_tokens"]) == 4
    assert one["tokens_per_s"] > 0 and split["speedup_vs_tp1"] > 0


def test_tp_scaling_split_first_as_generate_does(tmp_path):
    """``--split-first``: the model split right after quantizing (as ``lowbit generate`` under torchrun), then
    decoded with each kind: rows for TP = 2 only, every token produced."""
    res = _tp_scaling(tmp_path, "--split-first", "--allreduce", "auto,nccl", "--batch", "1")
    rows = res["rows"]
    assert [(row["allreduce"], row["batch"]) for row in rows] == [("auto", 1), ("nccl", 1)], rows
    assert rows[0]["allreduce_used"] == "nccl" and all(row["tokens_per_s"] > 0 for row in rows), rows
    assert res["info"]["split_modules"] == 8 and res["info"]["split_plain_linears"] == 1


def test_tp_split_in_bf16_is_its_summation_order(tmp_path):
    """In bf16 a rank's partial sums are rounded before they are added, so the split's logits move further from
    the whole model's than fp32's bound; they must equal the one-process emulation of that summation order
    (tp.emulated_row_split) and stay as close to fp32 activations as the whole bf16 model is."""
    info = _tp_scaling(tmp_path, "--dtype", "bfloat16", "--layers", "4", "--allreduce", "nccl", "--batch", "1")["info"]
    got, logits = info["logits_vs_tp1"]["nccl"], info["logits"]
    assert got["finite"] and got["vs_emulated_split"] <= 1e-6, got
    assert got["vs_fp32"] <= 2 * logits["whole_vs_fp32"], (got, logits)


def test_emulated_row_split_and_upcast_leave_the_model_as_it_was():
    """tp.emulated_row_split sums each rowwise module's parts only inside its block (o_proj and down_proj of every
    layer); quality.upcast computes in fp32 inside its block and gives every tensor its own dtype back, the rotary
    frequencies' fp32 included, so the model's logits after both are bit-identical to before."""
    import lowbit
    from lowbit.hf import quality, tp

    model = build("llama", 5, inter=256)
    lowbit.quantize_model(model, progress=False)
    model.to(torch.bfloat16)
    inv_freq = model.model.rotary_emb.inv_freq
    inv_freq.data = inv_freq.data.float()  # as transformers keeps it
    ids = torch.tensor([[3, 17, 99, 250, 7, 64]])
    with torch.no_grad():
        before = model(ids).logits
        with tp.emulated_row_split(model, 2) as n:
            split = model(ids).logits
        with quality.upcast(model):
            assert model.lm_head.weight.dtype == torch.float32
            fp32 = model(ids).logits
        after = model(ids).logits
    assert n == 2 * model.config.num_hidden_layers
    assert torch.equal(before, after)
    assert inv_freq.dtype == torch.float32 and model.lm_head.weight.dtype == torch.bfloat16
    assert fp32.dtype == torch.float32 and not torch.equal(split, before)  # the parts are rounded before the sum
    assert torch.isfinite(split).all() and ((split.float() - before.float()).norm() / before.float().norm()) < 0.05
