"""Regenerate the README's table of headline numbers on a GPU (one command, ~5 minutes on an H100).

    python3 benchmarks/headline.py                  # measure, print the table, keep the JSON
    python3 benchmarks/headline.py --write-readme   # ... and replace the table in README.md
    python3 benchmarks/headline.py --from FILE --write-readme   # table from a kept JSON, no GPU

Two measurements, each the command a user would type:
- end to end: ``lowbit generate --model random:llama-3-8b --compile --compare --format kbit,nvfp4``
  (Llama-3-8B shapes, random weights, batch 1, torch.compile + CUDA graph; bf16, kbit4 and NVFP4
  side by side in one process);
- one kernel: ``lowbit bench --shape 8192x29568 --m 1`` (the largest Llama-3-70B MLP weight) for
  kbit4, torch int4 and cuBLAS bf16, cold L2 over rotating weight copies, with the % of the
  GPU's measured read bandwidth.
The README's table sits between the markers ``<!-- headline:start -->`` and ``<!-- headline:end -->``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
E2E_CMD = "lowbit generate --model random:llama-3-8b --compile --compare --format kbit,nvfp4"
KERNEL_SHAPE, KERNEL_METHODS = "8192x29568", "lowbit-kbit4,torch-int4,cublas-bf16"
KERNEL_CMD = f"lowbit bench --shape {KERNEL_SHAPE} --m 1 --methods {KERNEL_METHODS}"


def measure() -> dict:
    import torch

    from lowbit.hf.generate import generate

    if not torch.cuda.is_available():
        sys.exit("headline.py measures on a CUDA GPU; use --from FILE to rebuild the table from a kept JSON")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "lowbit", *KERNEL_CMD.split()[1:], "--no-plots", "--out", tmp]
        subprocess.run(cmd, check=True)
        rows = json.loads((Path(tmp) / "results.json").read_text())["rows"]
    kernel = {r["method"]: {"us": r["cold_us"], "pct": r["cold_pct"]} for r in rows if r["status"] == "ok"}
    e2e = generate("random:llama-3-8b", compile=True, compare=True, fmt="kbit,nvfp4")
    return {"date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name(),
            "e2e_command": E2E_CMD, "kernel_command": KERNEL_CMD,
            "e2e": {"bf16": e2e["unquantized"]["tokens_per_s"],
                    **{k: {"tokens_per_s": v["tokens_per_s"]} for k, v in e2e["variants"].items()}},
            "kernel": kernel}


def table(h: dict) -> str:
    bf16 = h["e2e"]["bf16"]
    lines = [f"Measured {h['date']} on an {h['device']}; `python3 benchmarks/headline.py` re-measures.", "",
             "| what | command | bf16 | kbit4 | NVFP4 |", "|---|---|---|---|---|"]
    k4, nv = h["e2e"]["kbit4"], h["e2e"]["nvfp4"]
    lines.append(f"| Llama-3-8B shapes, decode tokens/s, batch 1 | `{h['e2e_command']}` | {bf16:.0f} | "
                 f"{k4['tokens_per_s']:.0f} ({k4['tokens_per_s'] / bf16:.2f}x) | "
                 f"{nv['tokens_per_s']:.0f} ({nv['tokens_per_s'] / bf16:.2f}x) |")
    kern = h["kernel"]
    cells = [kern.get(m) for m in ("cublas-bf16", "lowbit-kbit4")]
    fmt = [f"{c['us']:.1f} us ({c['pct']:.0f}% of read bandwidth)" if c else "-" for c in cells]
    int4 = kern.get("torch-int4")
    lines.append(f"| one {KERNEL_SHAPE.replace('x', ' -> ')} GEMV, M = 1, cold L2 | `{h['kernel_command']}` | {fmt[0]} | "
                 f"{fmt[1]}" + (f"; torch int4: {int4['us']:.1f} us" if int4 else "") + " | - |")
    return "\n".join(lines)


def write_readme(text: str) -> None:
    path = ROOT / "README.md"
    readme = path.read_text()
    pattern = re.compile(r"(<!-- headline:start -->\n).*?(\n<!-- headline:end -->)", re.S)
    if not pattern.search(readme):
        sys.exit("README.md has no <!-- headline:start --> ... <!-- headline:end --> block")
    path.write_text(pattern.sub(lambda m: m.group(1) + text + m.group(2), readme))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="src", type=Path, default=None, help="a headline JSON kept by an earlier run")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "headline.json")
    ap.add_argument("--write-readme", action="store_true", help="replace the table in README.md")
    args = ap.parse_args()
    if args.src:
        h = json.loads(args.src.read_text())
    else:
        h = measure()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(h, indent=1))
    text = table(h)
    print(text)
    if args.write_readme:
        write_readme(text)


if __name__ == "__main__":
    main()
