"""Benchmark columns: every lowbit path plus cuBLAS and peer libraries, behind one interface.

A method turns a dense weight ``[N, K_in]`` into its own representation (``prepare``), runs
``y = x @ W^T`` on it (``run``), and says how many bytes that representation forces a kernel
to read (``weight_bytes``). lowbit methods also name their format reference, which the
harness uses as a correctness gate before timing. Peers are detected at run time and are
never required.
"""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable

import torch

import lowbit
from lowbit.formats import kbit


@dataclass
class Method:
    name: str
    description: str
    act_dtype: torch.dtype
    prepare: Callable[[torch.Tensor], Any]
    run: Callable[[torch.Tensor, Any], torch.Tensor]
    weight_bytes: Callable[[Any], int]
    #: lowbit paths: (x, state) -> the format reference's output; None for peers.
    reference: Callable[[torch.Tensor, Any], torch.Tensor] | None = None
    #: relative-error bound of run() against reference (lowbit) or against the dense fp product (peers).
    tolerance: float = 0.0
    unavailable: str | None = None  # reason, when the method cannot run here
    #: MoE experts in one launch per projection: prepare_experts([W_e]) -> state,
    #: prepare_input(x_sorted, counts) -> inp, run_grouped(inp, state) -> y (rows sorted by expert).
    prepare_experts: Callable[[list], Any] | None = None
    prepare_input: Callable[[torch.Tensor, torch.Tensor], Any] | None = None
    run_grouped: Callable[[Any, Any], torch.Tensor] | None = None
    experts_only: bool = False  # a MoE-block variant: no dense rows
    by_default: bool = True  # in the default column set (path-pinned variants are asked for by name)

    @property
    def is_lowbit(self) -> bool:
        return self.reference is not None

    def clone_state(self, state: Any) -> Any:
        """A physically separate copy of the prepared weights (for cold-L2 rotation)."""
        return copy.deepcopy(state)


def _cublas(dtype: torch.dtype) -> Method:
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    return Method(
        name=f"cublas-{name}",
        description=f"torch.nn.functional.linear, {name} weights (cuBLAS)",
        act_dtype=dtype,
        prepare=lambda w: w.to(dtype).contiguous(),
        run=lambda x, w: torch.nn.functional.linear(x, w),
        weight_bytes=lambda w: w.numel() * w.element_size(),
        tolerance=1e-2,
    )


def _lowbit_dense(dtype: torch.dtype, pdl: bool = False) -> Method:
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]

    def run(x, w):
        with lowbit.programmatic_launch(pdl):
            return lowbit.dense_linear(x, w)

    return Method(
        name=f"lowbit-{name}" + ("-pdl" if pdl else ""),
        description=f"lowbit.dense_linear, {name} weights (lowbit's tuned GEMV for M <= 4, cuBLAS above)"
        + ("; programmatic dependent launch: overlaps each call with the previous one" if pdl else ""),
        act_dtype=dtype,
        prepare=lambda w: w.to(dtype).contiguous(),
        run=run,
        weight_bytes=lambda w: w.numel() * w.element_size(),
        reference=lambda x, w: lowbit.ops.dense_gemv_reference(x.reshape(-1, x.shape[-1]), w),
        tolerance={torch.float16: 2e-3, torch.bfloat16: 8e-3}[dtype],  # M > 4 runs cuBLAS
    )


#: dense kbit paths a column can pin (lowbit.dispatch.forced_path); None: the dispatcher's choice.
KBIT_PATHS = {"gemv": "the decode GEMV (M <= 8; grouped: the grouped GEMV)",
              "gemm": "the tensor-core kbit GEMM (grouped: the grouped GEMM)",
              "dequant": "the tiled dequantize kernel + cuBLAS"}


def _kbit(bits: int, grouped: bool = True, pdl: bool = False, path: str | None = None) -> Method:
    def prepare(w):
        q = lowbit.quantize_kbit(w, bits=bits)
        q.tiled()
        return q

    def prepare_experts(ws):
        ex = lowbit.quantize_kbit_experts(torch.stack(ws), bits=bits)
        ex.tiled()
        return ex

    def prepare_input(x, counts):
        off = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(device=x.device, dtype=torch.int64)
        return x, off

    forced = {"dequant": "dequant_matmul"}.get(path, path)

    def run(x, q):
        with lowbit.programmatic_launch(pdl), lowbit.dispatch.forced_path(forced):
            return lowbit.kbit_linear(x, q)

    def run_grouped(inp, ex):
        with lowbit.programmatic_launch(pdl), lowbit.dispatch.forced_path(forced):
            return lowbit.kbit_grouped_linear(inp[0], inp[1], ex)

    return Method(
        name=f"lowbit-kbit{bits}" + ("" if grouped else "-loop") + ("-pdl" if pdl else "") + (f"-{path}" if path else ""),
        description=f"lowbit kbit K={bits} ({bits + 0.25} bits/weight), lowbit.kbit_linear"
        + (f" pinned to {KBIT_PATHS[path]} (where it can run)" if path else "")
        + (" / kbit_grouped_linear for MoE experts" if grouped else "; MoE experts one launch each")
        + ("; programmatic dependent launch: overlaps each call with the previous one" if pdl else ""),
        act_dtype=torch.float16,
        prepare=prepare,
        run=run,
        weight_bytes=lambda q: q.nbytes(),
        reference=lambda x, q: kbit.linear_reference(x, *q.tensors(), q.bits),
        tolerance=2e-3,  # fp16 activations/outputs vs the fp32 reference
        prepare_experts=prepare_experts if grouped else None,
        prepare_input=prepare_input if grouped else None,
        run_grouped=run_grouped if grouped else None,
        experts_only=not grouped,
        by_default=path is None,
    )


NVFP4_PATHS = {"gemv": "the decode GEMV (M <= 8)", "gemm": "the tensor-core GEMM (the kbit GEMM's NVFP4 instance)",
               "dequant": "the NVFP4 dequantize kernel + cuBLAS"}


def _nvfp4(path: str | None = None) -> Method:
    from lowbit.formats import nvfp4

    forced = {"dequant": "dequant_matmul"}.get(path, path)

    def prepare(w):
        q = lowbit.quantize_nvfp4(w)
        q.tiled()  # the tiled copy the GEMV (M > 1) and GEMM read, built before timing
        return q

    def run(x, q):
        with lowbit.dispatch.forced_path(forced):
            return lowbit.nvfp4_linear(x, q)

    def prepare_input(x, counts):
        return x, torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(device=x.device, dtype=torch.int64)

    grouped = path is None  # MoE blocks: the grouped GEMV (one launch per projection)
    return Method(
        name="lowbit-nvfp4" + (f"-{path}" if path else ""),
        description="lowbit NVFP4 (E2M1 + E4M3 scale per 16 + fp32 tensor scale, 4.5 bits/weight), lowbit.nvfp4_linear"
        + (f" pinned to {NVFP4_PATHS[path]} (where it can run)" if path else " / nvfp4_grouped_linear for MoE experts"),
        act_dtype=torch.float16,
        prepare=prepare,
        run=run,
        weight_bytes=lambda q: q.nbytes(),  # one layout's bytes: a call reads the checkpoint or the tiled copy
        reference=lambda x, q: nvfp4.linear_reference(x, q),
        tolerance=2e-3,
        prepare_experts=(lambda ws: lowbit.quantize_nvfp4_experts(torch.stack(ws))) if grouped else None,
        prepare_input=prepare_input if grouped else None,
        run_grouped=(lambda inp, ex: lowbit.nvfp4_grouped_linear(inp[0], inp[1], ex)) if grouped else None,
        by_default=path is None,
    )


def _cublas_bmm() -> Method:
    def prepare_input(x, counts):
        """Tokens sorted by expert -> [experts, max tokens, K_in], zero-padded (done before timing)."""
        a, cmax = counts.numel(), int(counts.max())
        xp = x.new_zeros(a, cmax, x.shape[1])
        off = 0
        for i, c in enumerate(counts.tolist()):
            xp[i, :c] = x[off:off + c]
            off += c
        return xp, counts

    def run_grouped(inp, w):
        xp, counts = inp
        return torch.bmm(xp, w.transpose(1, 2))  # padded rows computed too, as a padded bmm does

    return Method(
        name="cublas-fp16-bmm",
        description="torch.bmm over the active experts, fp16, tokens zero-padded to the largest count",
        act_dtype=torch.float16,
        prepare=lambda w: w.half().contiguous(),
        run=lambda x, w: torch.nn.functional.linear(x, w),
        weight_bytes=lambda w: w.numel() * w.element_size(),
        tolerance=1e-2,
        prepare_experts=lambda ws: torch.stack(ws).half().contiguous(),
        prepare_input=prepare_input,
        run_grouped=run_grouped,
        experts_only=True,
    )


# ----------------------------------------------------------------------------- torch int4
INT4_GROUP = 128


def _int4_prepare(w: torch.Tensor):
    n, k = w.shape
    g = w.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
    mn, mx = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = (mx - mn).clamp(min=1e-6) / 15
    q = ((g - mn) / scale).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    zero = mn + 8 * scale  # tinygemm convention: w = (q - 8) * scale + zero
    packed_u8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
    packed = torch.ops.aten._convert_weight_to_int4pack(packed_u8, 8)
    sz = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)  # [K/g, N, 2]
    return packed, sz


def _torch_int4() -> Method:
    unavailable = None
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm"):
        unavailable = "torch.ops.aten._weight_int4pack_mm not in this torch build"
    return Method(
        name="torch-int4",
        description=f"torch.ops.aten._weight_int4pack_mm, int4 asymmetric, g={INT4_GROUP} (tinygemm)",
        act_dtype=torch.bfloat16,
        prepare=_int4_prepare,
        run=lambda x, s: torch.ops.aten._weight_int4pack_mm(x, s[0], INT4_GROUP, s[1]),
        weight_bytes=lambda s: s[0].numel() * s[0].element_size() + s[1].numel() * s[1].element_size(),
        tolerance=0.25,
        unavailable=unavailable,
    )


# ----------------------------------------------------------------------------- bitsandbytes
def _bnb_nf4() -> Method:
    unavailable = None if importlib.util.find_spec("bitsandbytes") else "bitsandbytes not installed"

    def prepare(w):
        import bitsandbytes.functional as bnbf

        return bnbf.quantize_4bit(w.half(), quant_type="nf4", blocksize=64, compress_statistics=True)

    def run(x, s):
        import bitsandbytes as bnb

        return bnb.matmul_4bit(x, s[0].t(), quant_state=s[1])

    def nbytes(s):
        wq, st = s
        total = wq.numel() * wq.element_size() + st.absmax.numel() * st.absmax.element_size()
        if getattr(st, "nested", False):
            total += st.state2.absmax.numel() * st.state2.absmax.element_size()
        return total

    return Method(
        name="bnb-nf4",
        description="bitsandbytes.matmul_4bit, NF4, blocksize 64, nested absmax",
        act_dtype=torch.float16,
        prepare=prepare,
        run=run,
        weight_bytes=nbytes,
        tolerance=0.25,
        unavailable=unavailable,
    )


# ----------------------------------------------------------------------------- gemlite
GEMLITE_GROUP = 128


def _gemlite_a16w4() -> Method:
    unavailable = None if importlib.util.find_spec("gemlite") else "gemlite not installed"

    def prepare(w):
        from gemlite.helper import A16Wn

        n, k = w.shape
        g = w.float().reshape(n, k // GEMLITE_GROUP, GEMLITE_GROUP)
        mn, mx = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        scale = (mx - mn).clamp(min=1e-6) / 15
        q = ((g - mn) / scale).round().clamp(0, 15).to(torch.uint8).reshape(n, k)
        zero = (-mn / scale).reshape(n, -1)  # gemlite: w = (q - zero) * scale
        layer = A16Wn(device=str(w.device), dtype=torch.float16).from_weights(
            q, scale.reshape(n, -1).half(), zero.half(), W_nbits=4, group_size=GEMLITE_GROUP
        )
        return layer

    def nbytes(layer):
        return sum(t.numel() * t.element_size() for t in (layer.W_q, layer.scales, layer.zeros) if t is not None)

    return Method(
        name="gemlite-a16w4",
        description=f"gemlite A16W4, int4 asymmetric, g={GEMLITE_GROUP} (Triton)",
        act_dtype=torch.float16,
        prepare=prepare,
        run=lambda x, layer: layer(x),
        weight_bytes=nbytes,
        tolerance=0.25,
        unavailable=unavailable,
    )


def _sbvr(num_sums: int, path: str | None = None) -> Method:
    from lowbit.formats import sbvr

    act_bits = sbvr.tiled.ACT_BITS

    def prepare(w):
        q = lowbit.quantize_sbvr(w, num_sums=num_sums)
        q.layouts()
        return q

    def run(x, q):
        with lowbit.dispatch.forced_path(path):
            return lowbit.sbvr_linear(x, q, act_bits=act_bits)

    def reference(x, q):
        with lowbit.dispatch.forced_path(path):
            rounded = lowbit.dispatch.sbvr_path(x, num_sums, q.group, act_bits) == "popcount"
        if rounded:
            return sbvr.linear_bitplane_reference(x, *q.tensors(), q.group, act_bits)
        return sbvr.linear_reference(x, q)

    def prepare_experts(ws):
        ex = lowbit.quantize_sbvr_experts(torch.stack(ws), num_sums=num_sums)
        ex.layouts()
        return ex

    def prepare_input(x, counts):
        return x, torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(device=x.device, dtype=torch.int64)

    grouped = path is None  # MoE blocks: the grouped popcount GEMV (one launch per projection)
    what = {None: "the dispatcher's choice per M", "popcount": "pinned to the popcount GEMV (x rounded to 8 bits)",
            "lookup": "pinned to the weight-only lookup GEMV", "dequant_matmul": "pinned to dequantize + cuBLAS"}[path]
    return Method(
        name=f"lowbit-sbvr{num_sums}" + (f"-{path.split('_')[0]}" if path else ""),
        description=f"lowbit SBVR, {num_sums} bitvectors per 128-group (~{num_sums + 0.125} bits/weight), "
                    f"lowbit.sbvr_linear(act_bits=8): {what}",
        act_dtype=torch.float16,
        prepare=prepare,
        run=run,
        weight_bytes=lambda q: q.nbytes(),
        reference=reference,
        tolerance=2e-3,
        prepare_experts=prepare_experts if grouped else None,
        prepare_input=prepare_input if grouped else None,
        run_grouped=(lambda inp, ex: lowbit.sbvr_grouped_linear(inp[0], inp[1], ex)) if grouped else None,
        by_default=False,
    )


def all_methods() -> dict[str, Method]:
    methods = [_cublas(torch.float16), _cublas(torch.bfloat16)]
    methods += [_lowbit_dense(torch.float16), _lowbit_dense(torch.bfloat16)]
    methods += [_lowbit_dense(torch.float16, pdl=True), _lowbit_dense(torch.bfloat16, pdl=True)]
    methods += [_kbit(b) for b in kbit.SUPPORTED_BITS] + [_kbit(4, pdl=True)]
    methods += [_kbit(b, path=p) for b in kbit.SUPPORTED_BITS for p in KBIT_PATHS]
    methods += [_nvfp4()] + [_nvfp4(p) for p in NVFP4_PATHS]
    methods += [_sbvr(ns, p) for ns in (2, 3, 4) for p in (None, "popcount", "lookup", "dequant_matmul")]
    methods += [_torch_int4(), _bnb_nf4(), _gemlite_a16w4()]
    methods += [_kbit(b, grouped=False) for b in kbit.SUPPORTED_BITS] + [_cublas_bmm()]
    return {m.name: m for m in methods}


def select(names: list[str] | None) -> list[Method]:
    """Methods by name (None: the default columns -- all but the MoE-only and path-pinned variants);
    unknown names raise ValueError."""
    table = all_methods()
    if not names:
        return [m for m in table.values() if not m.experts_only and m.by_default]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {', '.join(table)}")
    return [table[n] for n in names]
