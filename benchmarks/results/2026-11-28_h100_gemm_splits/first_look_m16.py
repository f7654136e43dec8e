"""M = 16 kbit4 GEMM: splits and tiles-per-warp against the GEMV at M = 1 / 8 and cuBLAS, cold."""
import sys, torch, lowbit
from lowbit.bench.timing import copies_for_cold, graph_time, l2_bytes
from lowbit.bench.crossover import path_time
from lowbit.kernels import tiled
from lowbit.kernels.kbit import kbit_format
from lowbit.kernels.library import library_or_none

dev = torch.device("cuda")
lib = library_or_none(dev)
shapes = [tuple(map(int, s.split("x"))) for s in sys.argv[1].split(",")]
ms = [int(v) for v in sys.argv[2].split(",")] if len(sys.argv) > 2 else [16]
t = lambda fns: graph_time(fns, replays=8, warmup=2).median_us
for k_in, n in shapes:
    w = torch.randn(n, k_in, device=dev, dtype=torch.float16)
    q = lowbit.quantize_kbit(w, bits=4)
    qs = [q] + [lowbit.quantize_kbit(w, bits=4) for _ in range(copies_for_cold(q.nbytes(), l2_bytes()) - 1)]
    for c in qs: c.tiled()
    ws = [w] + [w.clone() for _ in range(copies_for_cold(w.numel() * 2, l2_bytes()) - 1)]
    x1 = torch.randn(1, k_in, device=dev, dtype=torch.float16)
    x8 = torch.randn(8, k_in, device=dev, dtype=torch.float16)
    line = f"{k_in}x{n}: gemv M=1 {path_time(x1, qs, 'gemv', 8):6.2f} M=8 {path_time(x8, qs, 'gemv', 8):6.2f}"
    print(line, flush=True)
    for m in ms:
        x = torch.randn(m, k_in, device=dev, dtype=torch.float16)
        cub = t([lambda v=v: torch.nn.functional.linear(x, v) for v in ws])
        res = []
        for r in (1, 2):
            tiled.GEMM_TILES_PER_WARP = r
            launchers = []
            for c in qs:
                qw, qa = c.tiled()
                launchers.append(tiled.GemmLauncher(lib, qw, qa, c.codebook, c.scale, kbit_format(4), n, k_in))
            fn, nt, rr, auto, _, _ = launchers[0].plan(x.dtype, m)
            groups = k_in // 256
            for s in sorted({1, 2, 3, 4, 6, 8, 12, 16, auto} & set(range(1, groups + 1))):
                us = t([lambda L=L, s=s: L(x, splits=s) for L in launchers])
                res.append(f"r{rr}s{s}{'*' if s == auto else ''}={us:.2f}")
        tiled.GEMM_TILES_PER_WARP = None
        print(f"   M={m} cublas {cub:6.2f} auto {path_time(x, qs, None, 8):6.2f} | " + " ".join(res), flush=True)
    del qs, ws
