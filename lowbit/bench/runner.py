"""Run methods over shapes and batch sizes: correctness gate first, then cold/hot timing."""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass, field

import torch

from .methods import Method
from .presets import Linear, Moe, Preset
from .routing import expert_offsets, route
from .timing import copies_for_cold, graph_time, l2_bytes

EXPERTS_LAYER = "experts"


@dataclass
class Row:
    preset: str
    layer: str  # linear name, or "experts" for a MoE block (all active experts' projections)
    k_in: int
    n: int
    m: int
    method: str
    status: str = "ok"  # "ok", "FAIL: ...", "skip: ..."
    rel_err: float | None = None
    cold_us: float | None = None
    hot_us: float | None = None
    read_bytes: int | None = None  # bytes the kernel(s) must read: weights + activations
    cold_pct: float | None = None  # % of measured read bandwidth (cold)
    hot_pct: float | None = None
    calls: int = 1  # kernel calls per layer (active expert projections for a MoE block)
    copies: int | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """||y - ref|| / ||ref|| in float64; NaN if ``y`` holds a NaN or an infinity."""
    y, ref = y.double(), ref.double()
    if not torch.isfinite(y).all():
        return float("nan")
    return ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"{type(e).__name__}: {msg[:160]}"


class Runner:
    def __init__(self, methods: list[Method], read_bw: float, *, replays: int = 20, hot: bool = True, seed: int = 0):
        self.methods = methods
        self.read_bw = read_bw
        self.replays = replays
        self.hot = hot
        self.seed = seed
        self.l2 = l2_bytes()
        self.gen = torch.Generator().manual_seed(seed)

    # --------------------------------------------------------------------- helpers
    def _weight(self, n: int, k_in: int) -> torch.Tensor:
        return (torch.randn(n, k_in, device="cuda", dtype=torch.float16) * 0.02).contiguous()

    def _check(self, method: Method, x: torch.Tensor, w: torch.Tensor, state) -> tuple[bool, float, str]:
        """Correctness gate: lowbit paths against their format reference, peers against x @ W^T."""
        y = method.run(x, state)
        if method.is_lowbit:
            ref = method.reference(x, state)
        else:
            ref = x.float() @ w.float().t()
        err = rel_err(y, ref)
        ok = err == err and err <= method.tolerance and tuple(y.shape) == (x.shape[0], w.shape[0])
        return ok, err, "" if ok else f"FAIL: rel err {err:.3g} > {method.tolerance:g} (or NaN/shape)"

    def _finish(self, row: Row, calls_cold, calls_hot, read_bytes: int) -> Row:
        t = graph_time(calls_cold, replays=self.replays)
        row.cold_us = t.median_us * row.calls if row.layer == EXPERTS_LAYER else t.median_us
        row.read_bytes = read_bytes
        row.cold_pct = 100.0 * read_bytes / (row.cold_us * 1e-6) / self.read_bw
        if self.hot:
            th = graph_time(calls_hot, replays=self.replays)
            row.hot_us = th.median_us * row.calls if row.layer == EXPERTS_LAYER else th.median_us
            row.hot_pct = 100.0 * read_bytes / (row.hot_us * 1e-6) / self.read_bw
        return row

    # --------------------------------------------------------------------- one dense linear
    def linear(self, preset: str, lin: Linear, m: int, method: Method) -> Row:
        return self.linear_rows(preset, lin, [m], method)[0]

    def linear_rows(self, preset: str, lin: Linear, ms: list[int], method: Method) -> list[Row]:
        """One row per M; the weights are prepared (quantized, cloned) once for all of them."""
        if method.experts_only:
            return []
        rows = [Row(preset, lin.name, lin.k_in, lin.n, m, method.name) for m in ms]
        if method.unavailable:
            for row in rows:
                row.status = f"skip: {method.unavailable}"
            return rows
        states = []
        try:
            t0 = time.perf_counter()
            w = self._weight(lin.n, lin.k_in)
            state = method.prepare(w)
            wb = method.weight_bytes(state)
            copies = copies_for_cold(wb, self.l2)
            states = [state] + [method.clone_state(state) for _ in range(copies - 1)]
            prep_s = time.perf_counter() - t0
        except Exception as e:  # a method that breaks is reported, never timed
            for row in rows:
                row.status = f"FAIL: {_short(e)}"
            return rows
        for row in rows:
            t0 = time.perf_counter()
            try:
                x = torch.randn(row.m, lin.k_in, device="cuda").to(method.act_dtype)
                ok, row.rel_err, why = self._check(method, x, w, state)
                if not ok:
                    row.status = why
                    continue
                row.copies = copies
                cold = [lambda s=s, x=x: method.run(x, s) for s in states]
                hot = [lambda x=x, st=state: method.run(x, st)] * len(states)
                self._finish(row, cold, hot, wb + x.numel() * x.element_size())
            except Exception as e:
                row.status = f"FAIL: {_short(e)}"
            finally:
                row.extra["wall_s"] = round(time.perf_counter() - t0, 3)
                row.extra["prepare_s"] = round(prep_s, 3)
        del states, state, w
        gc.collect()
        torch.cuda.empty_cache()
        return rows

    # --------------------------------------------------------------------- MoE block
    def moe(self, preset: str, moe: Moe, m: int, method: Method, max_unique: int = 16) -> Row:
        counts = route(m, moe.experts, moe.top_k, self.gen)
        active = [(e, int(c)) for e, c in enumerate(counts.tolist()) if c > 0]
        offsets = expert_offsets(counts).tolist()
        calls_per_copy = len(active) * len(moe.linears)
        row = Row(preset, EXPERTS_LAYER, moe.linears[0].k_in, moe.linears[0].n, m, method.name, calls=calls_per_copy)
        row.extra = {"experts": moe.experts, "top_k": moe.top_k, "active_experts": len(active),
                     "projections": [lin.name for lin in moe.linears]}
        if method.unavailable:
            row.status = f"skip: {method.unavailable}"
            return row
        t_start = time.perf_counter()
        try:
            rows_total = m * moe.top_k
            xs = {lin.k_in: torch.randn(rows_total, lin.k_in, device="cuda").to(method.act_dtype) for lin in moe.linears}
            # Distinct prepared weights per projection; further experts/copies are clones (fresh memory).
            base = {}
            for lin in moe.linears:
                ws = [self._weight(lin.n, lin.k_in) for _ in range(min(max_unique, len(active)))]
                base[lin.name] = [(w, method.prepare(w)) for w in ws]
                w0, s0 = base[lin.name][0]
                ok, err, why = self._check(method, xs[lin.k_in][: active[0][1]], w0, s0)
                row.rel_err = max(row.rel_err or 0.0, err) if err == err else err
                if not ok:
                    row.status = f"{why} ({lin.name})"
                    return row
            copy_bytes = sum(method.weight_bytes(base[lin.name][0][1]) for lin in moe.linears) * len(active)
            row.copies = copies_for_cold(copy_bytes, self.l2)
            act_bytes = sum(c for _e, c in active) * sum(lin.k_in for lin in moe.linears) * xs[moe.linears[0].k_in].element_size()
            if method.run_grouped is not None:
                return self._moe_grouped(row, moe, method, active, base, xs, copy_bytes + act_bytes)

            def expert_states(copy_idx):
                out = []
                for i, (e, _c) in enumerate(active):
                    per = {}
                    for lin in moe.linears:
                        _w, s = base[lin.name][i % len(base[lin.name])]
                        per[lin.name] = s if (copy_idx == 0 and i < len(base[lin.name])) else method.clone_state(s)
                    out.append(per)
                return out

            def calls_for(states):
                calls = []
                for (e, c), per in zip(active, states):
                    lo, hi = offsets[e], offsets[e] + c
                    for lin in moe.linears:
                        xe = xs[lin.k_in][lo:hi]
                        calls.append(lambda xe=xe, s=per[lin.name]: method.run(xe, s))
                return calls

            copies = [expert_states(i) for i in range(row.copies)]
            cold = [c for st in copies for c in calls_for(st)]
            hot = calls_for(copies[0]) * row.copies
            return self._finish(row, cold, hot, copy_bytes + act_bytes)
        except Exception as e:
            row.status = f"FAIL: {_short(e)}"
            return row
        finally:
            row.extra["wall_s"] = round(time.perf_counter() - t_start, 3)
            gc.collect()
            torch.cuda.empty_cache()

    def _moe_grouped(self, row: Row, moe: Moe, method: Method, active, base, xs, read_bytes: int) -> Row:
        """Experts block with one launch per projection over the active experts' stacked weights."""
        counts = torch.tensor([c for _e, c in active], dtype=torch.int64)
        inputs = {lin.k_in: method.prepare_input(xs[lin.k_in], counts) for lin in moe.linears}
        row.calls = len(moe.linears)
        row.extra["launches_per_layer"] = len(moe.linears)

        def stacked(lin):
            ws = [base[lin.name][i % len(base[lin.name])][0] for i in range(len(active))]
            return method.prepare_experts(ws)

        states = []
        for c in range(row.copies):
            per = {lin.name: stacked(lin) for lin in moe.linears}
            states.append(per)
        # gate: the grouped output equals the per-expert path, expert by expert
        for lin in moe.linears:
            y = method.run_grouped(inputs[lin.k_in], states[0][lin.name])
            off = 0
            for i, (_e, c) in enumerate(active):
                w_i, s_i = base[lin.name][i % len(base[lin.name])]
                x_i = xs[lin.k_in][off:off + c]
                ref = method.reference(x_i, s_i) if method.is_lowbit else x_i.float() @ w_i.float().t()
                got = y[off:off + c] if y.dim() == 2 else y[i, :c]
                err = rel_err(got, ref)
                row.rel_err = max(row.rel_err or 0.0, err) if err == err else err
                if not (err == err and err <= method.tolerance):
                    row.status = f"FAIL: grouped rel err {err:.3g} > {method.tolerance:g} ({lin.name}, expert {i})"
                    return row
                off += c
        cold = [lambda st=st, lin=lin: method.run_grouped(inputs[lin.k_in], st[lin.name]) for st in states for lin in moe.linears]
        hot = [lambda lin=lin: method.run_grouped(inputs[lin.k_in], states[0][lin.name]) for lin in moe.linears] * row.copies
        return self._finish(row, cold, hot, read_bytes)

    # --------------------------------------------------------------------- a whole preset
    def tasks(self, preset: Preset, ms: list[int], include_moe: bool = True):
        """Work items, each returning a list of rows: (linear, method) for all M, then MoE blocks."""
        for lin in preset.linears:
            for meth in self.methods:
                yield (lambda p=preset, lin=lin, meth=meth: self.linear_rows(p.name, lin, ms, meth))
        if include_moe and preset.moe is not None:
            for m in ms:
                for meth in self.methods:
                    yield (lambda p=preset, m=m, meth=meth: [self.moe(p.name, p.moe, m, meth)])


def cpu_reference_rows(preset: Preset, ms: list[int], bits_list: list[int], repeats: int = 5) -> list[Row]:
    """Time the CPU reference (no GPU needed): kbit linear_reference vs fp32 torch.nn.functional.linear."""
    import statistics

    import lowbit
    from lowbit.formats import kbit

    rows = []
    for m in ms:
        for lin in preset.linears:
            w = torch.randn(lin.n, lin.k_in) * 0.02
            x = torch.randn(m, lin.k_in)
            cases = [("cpu-fp32-linear", w, lambda x=x, w=w: torch.nn.functional.linear(x, w), lin.n * lin.k_in * 4)]
            for b in bits_list:
                q = lowbit.quantize_kbit(w, bits=b)
                cases.append((f"cpu-kbit{b}-reference", q, lambda x=x, q=q: kbit.linear_reference(x, *q.tensors(), q.bits), q.nbytes()))
            for name, _obj, fn, nbytes in cases:
                fn()
                ts = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    fn()
                    ts.append((time.perf_counter() - t0) * 1e6)
                rows.append(Row(preset.name, lin.name, lin.k_in, lin.n, m, name, hot_us=statistics.median(ts), read_bytes=nbytes))
    return rows
