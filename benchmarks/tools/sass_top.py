"""Rank a kernel's SASS by its stall samples, from an ncu source-page export (gemv_ncu.sh SOURCE=1).

    python3 benchmarks/tools/sass_top.py $OUT/sass_0.csv [--top 40]

Prints the sample totals by stall reason, the executed instructions by opcode, then the instructions with the
most samples, each with its top reasons. Column names are read from the export (they vary between ncu versions): "Warp Stall Sampling (All
Samples)" is the total, the stall_* columns (issued or not) its reasons, "Source" the instruction.
"""

import argparse
import csv


def number(s: str) -> float:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    lines = [l for l in open(args.csv, errors="replace") if l.startswith('"') and not l.startswith('"Kernel Name"')]
    rows, seen = [], set()
    for r in csv.DictReader(lines):  # the export can list an instruction twice (and repeat its header)
        if r.get("Address") not in seen and r.get("Address") != "Address":
            seen.add(r.get("Address"))
            rows.append(r)
    if not rows:
        print("no rows in", args.csv)
        return
    cols = list(rows[0].keys())
    src = next((c for c in cols if c.strip().lower() == "source"), cols[1] if len(cols) > 1 else cols[0])
    total_col = next((c for c in cols if c.startswith("Warp Stall Sampling (All")), None)
    reasons = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]
    if total_col is None:
        return
    tot = sum(number(r[total_col]) for r in rows)
    print(f"{len(rows)} instructions, {tot:.0f} samples ({total_col})")
    by_reason = {c: sum(number(r[c]) for r in rows) for c in reasons}
    for c, v in sorted(by_reason.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {c}: {v:.0f} ({100 * v / max(tot, 1):.1f}%)")
    executed = {}  # warp-level instructions executed, by opcode (predicates and modifiers dropped)
    for r in rows:
        ops = [o for o in r[src].split() if not o.startswith("@")]
        if ops:
            op = ops[0].split(".")[0]
            executed[op] = executed.get(op, 0.0) + number(r.get("Instructions Executed", "0"))
    total = sum(executed.values())
    print(f"instructions executed: {total:.0f}; by opcode (share):")
    print("  " + ", ".join(f"{k} {100 * v / max(total, 1):.1f}%" for k, v in sorted(executed.items(), key=lambda kv: -kv[1])[:16]))
    ranked = sorted(rows, key=lambda r: -number(r[total_col]))[: args.top]
    for r in ranked:
        top = sorted(((number(r[c]), c) for c in reasons), reverse=True)[:3]
        why = ", ".join(f"{c}={v:.0f}" for v, c in top if v)
        print(f"{number(r[total_col]):7.0f}  {r.get('Address', '')[-5:]:>5}  {r[src].strip()[:60]:60}  {why}")


if __name__ == "__main__":
    main()
