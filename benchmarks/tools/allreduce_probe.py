"""Latency of one small all-reduce (a decode step's [batch, hidden] partial sum) on each path PyTorch offers, timed
as a CUDA graph of ``--calls`` calls, each after a copy kernel (a row-split GEMV writing its partial output).

    torchrun --nproc-per-node 2 benchmarks/tools/allreduce_probe.py --kind nccl|symm-mem|nccl-window [--hidden 8192]

Kinds (one per process: the symmetric-memory backend is a process-wide setting):
  nccl         ``dist.all_reduce`` on an ordinary tensor (NCCL's ring / tree kernels);
  symm-mem     torch's one-shot kernel over P2P (``one_shot_all_reduce_copy`` into a CUDA-backend symmetric buffer);
  nccl-window  ``dist.all_reduce`` on a slice of a symmetric buffer allocated by torch's NCCL backend
               (``symm_mem.set_backend("NCCL")``: an NCCL window, where NCCL runs its symmetric kernels).
The sum is checked against the expected value on every rank; one JSON line per batch size goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", required=True, choices=["nccl", "symm-mem", "nccl-window"])
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--batch", default="1,4")
    p.add_argument("--calls", type=int, default=64)
    p.add_argument("--replays", type=int, default=20)
    args = p.parse_args()
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    rank = int(os.environ["RANK"])
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    group = dist.group.WORLD
    import torch.distributed._symmetric_memory as symm_mem

    buf = None
    if args.kind in ("symm-mem", "nccl-window"):
        if args.kind == "nccl-window":
            symm_mem.set_backend("NCCL")
        buf = symm_mem.empty(1 << 20, dtype=torch.bfloat16, device=dev)
        symm_mem.rendezvous(buf, group.group_name)
    for b in [int(v) for v in args.batch.split(",")]:
        n = b * args.hidden
        src = torch.full((b, args.hidden), float(rank + 1), dtype=torch.bfloat16, device=dev)
        if args.kind == "nccl":
            work = torch.empty_like(src)
        else:
            work = buf[:n].view(b, args.hidden)

        for copy in ([True] if args.kind == "symm-mem" else [True, False]):
            measure(args, b, n, src, work, copy, rank, group)
    dist.destroy_process_group()


def measure(args, b, n, src, work, copy, rank, group) -> None:
    if not copy:
        work.zero_()

    def call():
        if args.kind == "symm-mem":
            return torch.ops.symm_mem.one_shot_all_reduce_copy(work, src, "sum", group.group_name)
        if copy:
            work.copy_(src)
        dist.all_reduce(work, group=group)
        return work

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            out = call()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(args.calls):
            out = call()
    g.replay()
    torch.cuda.synchronize()
    # with the copy: the ranks' values summed; without it, work holds zeros (set below), and the sum stays 0
    expect = sum(r + 1 for r in range(dist.get_world_size())) if copy else 0
    ok = bool((out.float() == expect).all().item())
    times = []
    for _ in range(args.replays):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / args.calls)
    times.sort()
    if rank == 0:
        print(json.dumps({"kind": args.kind, "batch": b, "hidden": args.hidden, "us_median": times[len(times) // 2],
                          "us_min": times[0], "copy_before": copy, "sum_ok": ok, "calls": args.calls,
                          "device": torch.cuda.get_device_name(), "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                          "torch": torch.__version__}), flush=True)
    del g


if __name__ == "__main__":
    main()
