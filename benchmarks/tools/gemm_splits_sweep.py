"""The tiled GEMM at every K split count, beside the dispatcher's pick and the old fill-every-slot rule, cold L2.

    python3 benchmarks/tools/gemm_splits_sweep.py 2048x10240,4096x4096 16,32,64 [4 | 2 | 3 | 5 | nvfp4] [out.json]

Per shape (K_in x N) and M: the split count ``GemmLauncher.plan`` picks (``new``), the one the rule before
2026-11-28 picked (``old``: the fill of every resident CTA slot, two per SM where the instance fits them), the
fastest, and every count timed (us, one CUDA graph over weight copies >= 4 L2s). The data behind
``lowbit.kernels.tiled.gemm_splits``.
"""
import json
import sys

import torch

import lowbit
from lowbit.bench.timing import copies_for_cold, graph_time, l2_bytes
from lowbit.kernels import nvfp4 as nvfp4_kernels
from lowbit.kernels import tiled
from lowbit.kernels.kbit import kbit_format
from lowbit.kernels.library import library_or_none


def launchers_for(lib, w, fmt):
    """GEMM launchers over enough quantized copies of ``w`` to time it cold."""
    n, k_in = w.shape
    quant = (lambda: lowbit.quantize_nvfp4(w)) if fmt == "nvfp4" else (lambda: lowbit.quantize_kbit(w, bits=int(fmt)))
    first = quant()
    nbytes = first.nbytes() if hasattr(first, "nbytes") else n * k_in * 9 // 16
    out = []
    for c in [first] + [quant() for _ in range(copies_for_cold(nbytes, l2_bytes()) - 1)]:
        qw, qa = c.tiled()
        if fmt == "nvfp4":
            out.append(nvfp4_kernels.gemm_launcher(lib, qw, qa, c.scale_2.reshape(()).contiguous(), n, k_in))
        else:
            out.append(tiled.GemmLauncher(lib, qw, qa, c.codebook, c.scale, kbit_format(int(fmt)), n, k_in))
    return out


def main() -> None:
    shapes = [tuple(map(int, s.split("x"))) for s in sys.argv[1].split(",")]
    ms = [int(v) for v in sys.argv[2].split(",")]
    fmt = sys.argv[3] if len(sys.argv) > 3 else "4"
    dev = torch.device("cuda")
    lib = library_or_none(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"{torch.cuda.get_device_name(dev)}, format {fmt}, fp16, cold us per call")
    rows = []
    for k_in, n in shapes:
        launchers = launchers_for(lib, torch.randn(n, k_in, device=dev, dtype=torch.float16), fmt)
        first = launchers[0]
        for m in ms:
            x = torch.randn(m, k_in, device=dev, dtype=torch.float16)
            _, nt, r, new, _, _ = first.plan(x.dtype, m)
            chunks, row_blocks = -(-m // (8 * nt)), -(-first.tiles // (8 * r))
            occ = tiled._gemm_occupancy(lib, first.index, first.op, first.sym, x.dtype, nt=nt, r=r)
            old = tiled.gemm_splits(row_blocks, chunks, first.groups, occ * sms, 1)
            counts = sorted({1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, new, old} & set(range(1, first.groups + 1)))
            times = {s: graph_time([lambda L=L, s=s: L(x, splits=s) for L in launchers], replays=6, warmup=2).median_us
                     for s in counts}
            best = min(times, key=times.get)
            rows.append(dict(k_in=k_in, n=n, m=m, nt=nt, r=r, rb=row_blocks, groups=first.groups, auto=new, old=old,
                             occ=occ, times=times))
            print(f"{k_in}x{n} M={m} nt={nt} r={r} rb={row_blocks} g={first.groups}: new s{new} {times[new]:.2f} | "
                  f"old s{old} {times[old]:.2f} ({times[old] / times[new]:.3f}x) | best s{best} {times[best]:.2f} | "
                  + " ".join(f"{s}:{v:.2f}" for s, v in times.items()), flush=True)
        del launchers
    if len(sys.argv) > 4:
        with open(sys.argv[4], "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
