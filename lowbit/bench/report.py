"""Benchmark output: rich terminal tables, JSON (every number + environment), Markdown, PNG plots."""

from __future__ import annotations

import json
import platform
import subprocess
from collections import defaultdict
from pathlib import Path

from .runner import EXPERTS_LAYER, Row

BASELINE = "cublas-fp16"


def environment() -> dict:
    """GPU, clocks, driver, torch, CUDA, lowbit version and commit."""
    import torch

    import lowbit

    env = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "lowbit": lowbit.__version__, "host": platform.node()}
    import os

    try:
        env["git_commit"] = os.environ.get("LOWBIT_GIT_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except Exception:
        env["git_commit"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        env.update(gpu=p.name, sm_count=p.multi_processor_count, l2_bytes=p.L2_cache_size,
                   memory_bytes=p.total_memory, capability=f"{p.major}.{p.minor}")
        try:
            q = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,temperature.gpu"
            out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10).stdout.strip().splitlines()
            if out:
                env["nvidia_smi"] = dict(zip(q.split(","), (v.strip() for v in out[0].split(","))))
        except Exception:
            pass
    return env


# ----------------------------------------------------------------------------- aggregation
def layer_totals(rows: list[Row]) -> list[dict]:
    """Per (preset, m, method): sum of cold (and hot) times over every linear + the MoE block.

    A total exists only when every part was timed; a failed or skipped part makes it None.
    """
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for r in rows:
        groups[(r.preset, r.m, r.method)].append(r)
    out = []
    for (preset, m, method), rs in groups.items():
        complete = all(r.cold_us is not None for r in rs)
        cold = sum(r.cold_us for r in rs) if complete else None
        hot = sum(r.hot_us for r in rs) if complete and all(r.hot_us is not None for r in rs) else None
        read = sum(r.read_bytes or 0 for r in rs) if complete else None
        out.append({"preset": preset, "m": m, "method": method, "cold_us": cold, "hot_us": hot, "read_bytes": read,
                    "parts": len(rs), "calls": sum(r.calls for r in rs)})
    base = {(t["preset"], t["m"]): t["cold_us"] for t in out if t["method"] == BASELINE}
    for t in out:
        b = base.get((t["preset"], t["m"]))
        t["speedup_vs_cublas_fp16"] = (b / t["cold_us"]) if (b and t["cold_us"]) else None
    return out


def _methods_in_order(rows: list[Row]) -> list[str]:
    seen = []
    for r in rows:
        if r.method not in seen:
            seen.append(r.method)
    return seen


def _cell(r: Row | None, hot: bool = False) -> str:
    if r is None:
        return ""
    if r.status != "ok":
        return r.status.split(":")[0]
    us, pct = (r.hot_us, r.hot_pct) if hot else (r.cold_us, r.cold_pct)
    if us is None:
        return "-"
    return f"{us:.1f} ({pct:.0f}%)" if pct is not None else f"{us:.1f}"


def _shape_label(r: Row) -> str:
    if r.layer == EXPERTS_LAYER:
        return f"experts x{r.extra.get('active_experts', '?')} ({r.calls} calls)"
    dims = f"{r.k_in}x{r.n}"
    return dims if r.layer == dims else f"{r.layer} {dims}"


def shape_table_rows(rows: list[Row], hot: bool = False) -> tuple[list[str], list[list[str]]]:
    methods = _methods_in_order(rows)
    index = {(r.preset, r.layer, r.m, r.method): r for r in rows}
    keys = []
    for r in rows:
        k = (r.preset, r.layer, r.m)
        if k not in keys:
            keys.append(k)
    header = ["preset", "layer (K_in x N)", "M"] + methods
    body = []
    for preset, layer, m in keys:
        first = next(index[(preset, layer, m, meth)] for meth in methods if (preset, layer, m, meth) in index)
        body.append([preset, _shape_label(first), str(m)] + [_cell(index.get((preset, layer, m, meth)), hot) for meth in methods])
    return header, body


def layer_table_rows(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    totals = layer_totals(rows)
    methods = _methods_in_order(rows)
    idx = {(t["preset"], t["m"], t["method"]): t for t in totals}
    keys = sorted({(t["preset"], t["m"]) for t in totals}, key=lambda k: (k[0], k[1]))
    header = ["preset", "M"] + methods
    body = []
    for preset, m in keys:
        cells = []
        for meth in methods:
            t = idx.get((preset, m, meth))
            if t is None or t["cold_us"] is None:
                cells.append("n/a")
            else:
                sp = t["speedup_vs_cublas_fp16"]
                cells.append(f"{t['cold_us']:.1f}" + (f" ({sp:.2f}x)" if sp else ""))
        body.append([preset, str(m)] + cells)
    return header, body


# ----------------------------------------------------------------------------- writers
def make_console():
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=240)  # logs: never wrap the wide tables


def print_tables(rows: list[Row], console=None, cpu: bool = False) -> None:
    from rich.table import Table

    console = console or make_console()
    if cpu:
        tables = [("CPU reference, us per call (no cache control)", shape_table_rows(rows, hot=True))]
    else:
        tables = [
            ("cold L2, us per call (% of measured read bandwidth)", shape_table_rows(rows)),
            (f"per-layer totals, cold us (speedup vs {BASELINE})", layer_table_rows(rows)),
        ]
    for title, (header, body) in tables:
        t = Table(title=title, show_lines=False)
        for i, h in enumerate(header):
            t.add_column(h, justify="left" if i < 2 else "right")
        for b in body:
            t.add_row(*b)
        console.print(t)


def markdown(rows: list[Row], meta: dict) -> str:
    def table(header, body):
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(b) + " |" for b in body]
        return "\n".join(lines)

    env = meta.get("env", {})
    out = [f"# lowbit benchmark: {env.get('gpu', 'CPU')}", "",
           f"- command: `{meta.get('command', '')}`",
           f"- measured read bandwidth: {meta.get('read_bw', 0) / 1e12:.3f} TB/s; copy (read+write): "
           f"{meta.get('copy_bw', 0) / 1e12:.3f} TB/s",
           f"- torch {env.get('torch')}, CUDA {env.get('torch_cuda')}, lowbit {env.get('lowbit')} ({env.get('git_commit')}), "
           f"driver {env.get('nvidia_smi', {}).get('driver_version')}",
           "- method: CUDA-graph replay; cold = rotating weight copies >= 4x L2, hot = one copy; median of replays.",
           "  % = bytes the kernel must read (weights + activations) / time / measured read bandwidth.", "",
           ]
    if meta.get("cpu"):
        out += ["## CPU reference: us per call", "", table(*shape_table_rows(rows, hot=True)), ""]
    else:
        out += ["## Cold L2: us per call (% of read bandwidth)", "", table(*shape_table_rows(rows)), "",
                "## Hot L2: us per call (effective % of read bandwidth)", "", table(*shape_table_rows(rows, hot=True)), "",
                f"## Per-layer totals, cold (speedup vs {BASELINE})", "", table(*layer_table_rows(rows)), ""]
    fails = [r for r in rows if r.status.startswith("FAIL")]
    if fails:
        out += ["## Failures (not timed)", ""] + [f"- {r.method} {r.preset}/{r.layer} M={r.m}: {r.status}" for r in fails] + [""]
    return "\n".join(out)


def write_json(path: Path, rows: list[Row], meta: dict) -> None:
    data = {**meta, "rows": [r.to_dict() for r in rows], "layers": layer_totals(rows)}
    Path(path).write_text(json.dumps(data, indent=1, default=str))


def read_json(path: Path) -> tuple[list[Row], dict]:
    data = json.loads(Path(path).read_text())
    rows = [Row(**r) for r in data.pop("rows")]
    data.pop("layers", None)
    return rows, data


def write_plots(rows: list[Row], out_dir: Path) -> list[Path]:
    """Per preset: time vs layer (one panel per M), and % of bandwidth vs M per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    written = []
    by_preset: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        if r.status == "ok" and r.cold_us is not None:
            by_preset[r.preset].append(r)
    for preset, rs in by_preset.items():
        methods = _methods_in_order(rs)
        ms = sorted({r.m for r in rs})
        layers = []
        for r in rs:
            if r.layer not in layers:
                layers.append(r.layer)
        fig, axes = plt.subplots(1, len(ms), figsize=(5 * len(ms), 4.5), squeeze=False)
        for ax, m in zip(axes[0], ms):
            for meth in methods:
                pts = {r.layer: r.cold_us for r in rs if r.m == m and r.method == meth}
                xs = [i for i, lay in enumerate(layers) if lay in pts]
                ax.plot(xs, [pts[layers[i]] for i in xs], marker="o", label=meth)
            ax.set_xticks(range(len(layers)), layers, rotation=60, ha="right", fontsize=7)
            ax.set_yscale("log")
            ax.set_title(f"{preset}, M={m} (cold L2)")
            ax.set_ylabel("us per call")
        axes[0][-1].legend(fontsize=7)
        fig.tight_layout()
        p = out_dir / f"time_{preset}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)

        fig, ax = plt.subplots(figsize=(6, 4.5))
        for meth in methods:
            pts = []
            for m in ms:
                sel = [r for r in rs if r.m == m and r.method == meth and r.cold_pct is not None]
                if sel:  # all the preset's bytes at this M over all its time: sum(bytes) / sum(bytes / pct)
                    pts.append((m, sum(r.read_bytes for r in sel) / sum(r.read_bytes / r.cold_pct for r in sel)))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=meth)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("% of measured read bandwidth (cold)")
        ax.set_title(f"{preset}: bandwidth use vs batch")
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out_dir / f"bw_{preset}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written
