"""What the in-kernel block-32 rotation costs the kbit GEMV: the same weights timed with and without it.

    python3 benchmarks/tools/rotation_gemv_cost.py [--bits 2,3,4] [--m 1,4,8] [--shapes 4096x6144,...]

Shapes are K_inxN (default: the Llama-3-8B decode linears, a Llama-3-70B MLP shape and two small
ones). Each row: the module's eager launcher (the dispatcher's kernel choice) with ``rotation=0``
and ``rotation=32`` over rotating weight copies larger than L2 (cold, as a decode step sees them),
timed in one CUDA graph; the unrotated kernel's % of the measured read bandwidth beside it.
"""

import argparse

import torch

import lowbit
from lowbit.bench.timing import copies_for_cold, graph_time, l2_bytes, measure_read_bandwidth

SHAPES = "4096x6144,4096x4096,4096x28672,14336x4096,8192x28672,2048x512,2048x7168"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bits", default="2,3,4")
    ap.add_argument("--m", default="1,4,8")
    ap.add_argument("--shapes", default=SHAPES)
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = measure_read_bandwidth()
    print(f"{torch.cuda.get_device_name()}: read bandwidth {bw / 1e12:.2f} TB/s; bf16 activations; cold L2")
    print(f"{'shape':>12} {'bits':>4} {'M':>2} {'plain us':>9} {'rotated us':>10} {'cost':>7} {'plain %bw':>9}")
    for spec in args.shapes.split(","):
        k_in, n = map(int, spec.lower().split("x"))
        for bits in map(int, args.bits.split(",")):
            w = torch.randn(n, k_in, device=dev) * 0.02
            mods = {}
            for rot in (0, 32):
                one = lowbit.nn.KbitLinear.from_linear(torch.nn.Linear(k_in, n, bias=False, device=dev), bits, rotation=rot)
                one.weight_bytes = sum(b.numel() * b.element_size() for b in one.buffers())
                copies = copies_for_cold(one.weight_bytes, l2_bytes(dev))
                mods[rot] = [one] + [lowbit.nn.KbitLinear.from_linear(torch.nn.Linear(k_in, n, bias=False, device=dev), bits,
                                                                      rotation=rot) for _ in range(copies - 1)]
                for mod in mods[rot]:
                    mod.to(torch.bfloat16)
            del w
            for m in map(int, args.m.split(",")):
                x = torch.randn(m, k_in, device=dev, dtype=torch.bfloat16)
                t = {rot: graph_time([(lambda mod=mod: mod(x)) for mod in ms]).median_us for rot, ms in mods.items()}
                pct = 100 * mods[0][0].weight_bytes / (t[0] * 1e-6) / bw
                print(f"{spec:>12} {bits:>4} {m:>2} {t[0]:9.2f} {t[32]:10.2f} {100 * (t[32] / t[0] - 1):+6.1f}% {pct:8.1f}%",
                      flush=True)
            del mods
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
