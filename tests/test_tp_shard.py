"""QuantizedModule.tp_shard: a rank's part of a quantized module for tensor parallelism is exactly a slice of
the module's weight (codebook and tensor scales shared), so the ranks' outputs put together (concatenated
for colwise, summed for rowwise) are the module's output up to summation order."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lowbit.nn import FusedKbitLinear, KbitLinear, NvFp4Linear
from lowbit.nn.nvfp4 import FusedNvFp4Linear


def _linears(gen, k, outs, bias):
    mods = []
    for n in outs:
        lin = nn.Linear(k, n, bias=bias)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(n, k, generator=gen) * 0.05)
            if bias:
                lin.bias.copy_(torch.randn(n, generator=gen))
        mods.append(lin)
    return mods


def _modules(gen, bias):
    k = 256
    (one,) = _linears(gen, k, [96], bias)
    parts = _linears(gen, k, [64, 32, 32], bias)
    yield KbitLinear.from_linear(one, bits=3)
    yield KbitLinear.from_linear(one, bits=4, rotation=32)
    yield FusedKbitLinear.from_linears(parts, bits=4)
    yield NvFp4Linear.from_linear(one)
    yield FusedNvFp4Linear.from_linears(parts)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("bias", [False, True])
def test_parts_are_slices_of_the_weight(world, bias, gen):
    x = torch.randn(3, 256, generator=gen)
    for mod in _modules(gen, bias):
        full_w = mod.dequantize(torch.float32)
        sizes = list(getattr(mod, "out_sizes", None) or [mod.out_features])
        # colwise: each rank's rows of every projection, in order
        cols = [mod.tp_shard("colwise", r, world) for r in range(world)]
        for r, part in enumerate(cols):
            assert type(part) is type(mod)
            assert list(getattr(part, "out_sizes", None) or [part.out_features]) == [n // world for n in sizes]
            offsets = [sum(sizes[:i]) for i in range(len(sizes))]
            rows = torch.cat([torch.arange(o + r * n // world, o + (r + 1) * n // world) for o, n in zip(offsets, sizes)])
            assert torch.equal(part.dequantize(torch.float32), full_w[rows]), type(mod).__name__
            if bias:
                assert torch.equal(part.bias, mod.bias[rows])
        # rowwise: column blocks; partial outputs (without bias) sum to the output
        rows_parts = [mod.tp_shard("rowwise", r, world) for r in range(world)]
        k = 256 // world
        for r, part in enumerate(rows_parts):
            assert part.in_features == k
            assert torch.equal(part.dequantize(torch.float32), full_w[:, r * k:(r + 1) * k]), type(mod).__name__
        with torch.no_grad():
            y = mod(x)
            b = mod.bias if bias else 0
            total = sum(p(x[:, r * k:(r + 1) * k]) - b for r, p in enumerate(rows_parts)) + b
        assert torch.isfinite(total).all()
        assert (total - y).norm() <= 1e-5 * y.norm(), type(mod).__name__


def test_splits_off_the_format_blocks_are_refused(gen):
    (lin,) = _linears(gen, 96, [30], False)
    kb, nv = KbitLinear.from_linear(lin, bits=4), NvFp4Linear.from_linear(lin)
    with pytest.raises(ValueError, match="whole 32-element blocks"):
        kb.tp_shard("rowwise", 0, 2)  # 96 / 2 = 48 columns
    nv.tp_shard("rowwise", 1, 2)  # 48 = 3 NVFP4 blocks of 16: fine
    with pytest.raises(ValueError, match="whole 16-element blocks"):
        nv.tp_shard("rowwise", 0, 4)  # 24 columns
    with pytest.raises(ValueError, match="does not split into 4 equal"):
        kb.tp_shard("colwise", 0, 4)  # 30 rows
    with pytest.raises(ValueError, match="rank must be"):
        kb.tp_shard("colwise", 2, 2)
    with pytest.raises(ValueError, match="style must be"):
        kb.tp_shard("packed_colwise", 0, 2)


class _Experts(nn.Module):
    """transformers' fused expert block layout (gate_up_proj [E, 2I, H], down_proj [E, H, I], act(gate) * up)."""

    def __init__(self, gen, e=4, h=64, i=128):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * i, h, generator=gen) * 0.05)
        self.down_proj = nn.Parameter(torch.randn(e, h, i, generator=gen) * 0.05)
        self.act_fn = nn.SiLU()


@pytest.mark.parametrize("world", [2, 4])
def test_expert_block_parts_are_slices_and_sum_to_the_block(world, gen):
    from lowbit.nn.experts import KbitMoeExperts

    full = KbitMoeExperts.from_experts(_Experts(gen), bits=4)
    gu, dn = full.dequantize()
    i, part = 128, 128 // world
    x = torch.randn(5, 64, generator=gen)
    idx = torch.randint(0, 4, (5, 2), generator=gen)
    w = torch.rand(5, 2, generator=gen)
    total = 0
    for r in range(world):
        p = full.tp_shard("experts", r, world)
        assert p.intermediate_dim == part and torch.equal(p.codebook, full.codebook)
        pg, pd = p.dequantize()
        lo, hi = r * part, (r + 1) * part
        assert torch.equal(pg, torch.cat([gu[:, lo:hi], gu[:, i + lo:i + hi]], dim=1))
        assert torch.equal(pd, dn[:, :, lo:hi])
        with torch.no_grad():
            total = total + p(x, idx, w)
    with torch.no_grad():
        y = full(x, idx, w)
    assert torch.isfinite(total).all() and (total - y).norm() <= 1e-5 * y.norm()


def test_expert_block_splits_off_the_blocks_are_refused(gen):
    from lowbit.nn.experts import KbitMoeExperts

    full = KbitMoeExperts.from_experts(_Experts(gen, i=96), bits=4)
    with pytest.raises(ValueError, match="whole 32-element blocks"):
        full.tp_shard("experts", 0, 2)  # 48 features per rank
    with pytest.raises(ValueError, match="splits as 'experts'"):
        full.tp_shard("colwise", 0, 3)


@pytest.mark.parametrize("style", ["colwise", "rowwise"])
def test_a_part_cut_from_its_read_slices_alone(style, gen):
    """tp_read_slices names every stored-buffer range a rank's part is cut from (kbit: tiles and groups; NVFP4:
    rows, or columns of codes and scales): a module holding those ranges and zeros elsewhere gives the same
    part (what a rank reading a saved checkpoint in slices gets)."""
    from lowbit.nn import FusedNvFp4Linear, NvFp4Linear

    parts = _linears(gen, 1024, [96, 64, 32], False)  # 1024 columns: 4 groups of 256, 2 per rank
    for mod in (FusedKbitLinear.from_linears(parts, bits=4), KbitLinear.from_linear(parts[0], bits=3),
                FusedNvFp4Linear.from_linears(parts), NvFp4Linear.from_linear(parts[1])):
        for rank in range(2):
            sparse = mod.tp_shard("rowwise", 0, 1)  # a copy
            for b, index in mod.tp_read_slices(style, rank, 2).items():
                full = torch.zeros_like(getattr(mod, b))
                for idx in index:
                    full[idx] = getattr(mod, b)[idx]
                sparse._buffers[b] = full
            sparse.tensors_changed()
            want, got = mod.tp_shard(style, rank, 2), sparse.tp_shard(style, rank, 2)
            assert torch.equal(got.dequantize(torch.float32), want.dequantize(torch.float32))


@pytest.mark.parametrize("world", [2, 4])
def test_an_expert_part_cut_from_its_read_slices_alone(world, gen):
    """The expert block's tp_read_slices: every expert's tiles around its gate and up rows and groups around its
    down columns. A block holding only those ranges (zeros elsewhere) gives the same part, and the ranges are
    less than the whole (I = 1024: 4 groups of down columns, 128 tiles of gate|up rows)."""
    from lowbit.nn.experts import KbitMoeExperts

    full = KbitMoeExperts.from_experts(_Experts(gen, e=3, h=64, i=1024), bits=3)
    for rank in range(world):
        sparse = full.tp_shard("experts", 0, 1)  # a copy
        read = 0
        for b, index in full.tp_read_slices("experts", rank, world).items():
            whole = getattr(full, b)
            part = torch.zeros_like(whole)
            for idx in index:
                part[idx] = whole[idx]
                read += whole[idx].numel()
            sparse._buffers[b] = part
        sparse.tensors_changed()
        want, got = full.tp_shard("experts", rank, world), sparse.tp_shard("experts", rank, world)
        for a, b in zip(want.dequantize(), got.dequantize()):
            assert torch.equal(a, b)
        stacks = sum(getattr(full, f"{p}_{t}").numel() for p in ("gate_up", "down") for t in ("qweight", "qabsmax"))
        assert read == stacks // world
    with pytest.raises(ValueError, match="splits as 'experts'"):
        full.tp_read_slices("colwise", 0, 2)
