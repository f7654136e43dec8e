"""How lowbit/data/kbit_dispatch.json got the H200's gemv_kernels (run here, no GPU): the kbit entries as
`lowbit tune --kbit-gemv` wrote them on the H200 (kbit_dispatch_after_real_shapes.json: the default presets, then
--preset real-shapes; the entries were [bits, N, K_in, kernel] before the format key), and NVFP4's from
benchmarks/tools/nvfp4_m1_paths.py's timings on the same GPU (nvfp4_m1_paths.txt, plain against tiled at M = 1), each
decided by the tuner's own rule (lowbit.bench.crossover.gemv_pick: the fastest where it beats the rules' pick by > 2%).

    python3 benchmarks/results/2026-11-28_h200_gemv_picks/ship_picks.py
"""
import json
import re
from pathlib import Path

from lowbit.bench import crossover

here = Path(__file__).parent
gpu = "NVIDIA H200"
measured = {(f"kbit{b}", n, k): kernel for b, n, k, kernel in
            json.loads((here / "kbit_dispatch_after_real_shapes.json").read_text())["gpus"][gpu]["gemv_kernels"]}
for line in (here / "nvfp4_m1_paths.txt").read_text().splitlines():
    m = re.match(r"(\d+)x(\d+) M=1 plain\s+([\d.]+) us\s+tiled\s+([\d.]+) us.*dispatch: (\w+)", line)
    if m:
        k_in, n, plain, tiled, rules = int(m[1]), int(m[2]), float(m[3]), float(m[4]), m[5]
        measured[("nvfp4", n, k_in)] = crossover.gemv_pick({"plain": plain, "tiled": tiled}, rules)
shipped = Path(crossover.__file__).parents[1] / "data" / "kbit_dispatch.json"
data = json.loads(shipped.read_text())
data["gpus"][gpu].pop("gemv_kernels", None)  # the old [bits, ...] entries
shipped.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
crossover.save_gemv_kernels(shipped, gpu, measured)
print({k: v for k, v in measured.items() if v})
