"""Dense M = 9-16 through the grouped GEMV (one expert, rows taken 8 at a time) against the GEMM, cold."""
import sys, torch, lowbit
from lowbit import dispatch
from lowbit.bench.timing import copies_for_cold, graph_time, l2_bytes

dev = torch.device("cuda")
t = lambda fns: graph_time(fns, replays=8, warmup=2).median_us
for s in sys.argv[1].split(","):
    k_in, n = map(int, s.split("x"))
    w = torch.randn(1, n, k_in, device=dev, dtype=torch.float16)
    q = lowbit.quantize_kbit(w[0], bits=4)
    e = lowbit.quantize_kbit_experts(w, bits=4)
    c = copies_for_cold(q.nbytes(), l2_bytes())
    qs = [q] + [lowbit.quantize_kbit(w[0], bits=4) for _ in range(c - 1)]
    es = [e] + [lowbit.quantize_kbit_experts(w, bits=4) for _ in range(c - 1)]
    for v in qs: v.tiled()
    for v in es: v.tiled()
    out = []
    for m in (8, 12, 16):
        x = torch.randn(m, k_in, device=dev, dtype=torch.float16)
        off = torch.tensor([0, m], device=dev, dtype=torch.int64)
        ref = lowbit.kbit_linear(x, q).float()
        with dispatch.forced_path("gemv"):
            yg = lowbit.kbit_grouped_linear(x, off, e).float()
            err = ((yg - ref).norm() / ref.norm()).item()
            tg = t([lambda v=v: lowbit.kbit_grouped_linear(x, off, v) for v in es])
        td = t([lambda v=v: lowbit.kbit_linear(x, v) for v in qs])
        out.append(f"M={m}: dense {td:6.2f} ({dispatch.kbit_path(x, n)}) grouped-GEMV {tg:6.2f} (rel err {err:.1e})")
    print(f"{k_in}x{n}: " + " | ".join(out), flush=True)
