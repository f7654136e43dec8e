"""The decode step's bf16/fp16 lm_head through lowbit's dense GEMV (lowbit.hf.head) on the GPU.

Bound: the switched head's logits for 1..4 rows against the fp64 product, relative norm error <= the dense GEMV's
own bound (1e-3 fp16 / 8e-3 bf16: one rounding of the output); 5+ rows are cuBLAS's, bit for bit; NaN never passes.
A greedy decode switches the head of a bf16 model and of a quantized one and really calls the GEMV."""

import pytest
import torch
from torch import nn

import lowbit
from lowbit import dispatch
from lowbit.hf import decode
from lowbit.hf import head as hf_head

from ..tiny_models import llama
from .kbit_check import BOUND, DTYPES, rel
from .kbit_check import dtype_id as ids

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("bias", [False, True])
def test_switched_head(dtype, bias, gen):
    n, k = int(torch.randint(100, 5000, (1,), generator=gen)), 64 * int(torch.randint(1, 40, (1,), generator=gen))
    lin = nn.Linear(k, n, bias=bias).to("cuda", dtype)
    lin.weight.data = torch.randn(n, k, generator=gen).to("cuda", dtype)
    model = nn.Module()
    model.lm_head = lin
    model.get_output_embeddings = lambda: model.lm_head
    assert hf_head.refusal(lin) is None and hf_head.use_dense_head(model) and type(lin) is hf_head.LowbitDenseHead
    for rows in (1, 2, 3, 4, 5, 9):
        x = torch.randn(rows, 1, k, generator=gen).to("cuda", dtype)
        want = (x.double() @ lin.weight.double().t() + (lin.bias.double() if bias else 0)).cpu()
        got = lin(x)
        assert got.shape == (rows, 1, n) and not got.isnan().any()
        assert rel(got, want) <= BOUND[dtype], rows
        if rows > dispatch.DENSE_GEMV_MAX_M:
            assert torch.equal(got, nn.functional.linear(x, lin.weight, lin.bias))


@pytest.mark.parametrize("fmt", ["bf16", "kbit"])
def test_decode_takes_the_head_through_the_gemv(fmt, monkeypatch):
    cfg, cls = llama()
    torch.manual_seed(0)
    model = cls(cfg).to("cuda", torch.bfloat16).eval()
    if fmt == "kbit":
        lowbit.quantize_model(model, bits=4, progress=False)
    calls = []
    real = dispatch.dense_linear_op
    monkeypatch.setattr(dispatch, "dense_linear_op", lambda x2, w: calls.append(tuple(w.shape)) or real(x2, w))
    ids_ = torch.randint(0, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    r = decode.greedy_decode(model, ids_, 4, graph=False)
    assert type(model.get_output_embeddings()) is hf_head.LowbitDenseHead
    assert calls.count((cfg.vocab_size, cfg.hidden_size)) == 3  # the three decode steps; the prefill is cuBLAS's
    monkeypatch.setattr(hf_head, "DENSE", False)
    calls.clear()
    r2 = decode.greedy_decode(model, ids_, 4, graph=False)
    assert calls == [] and r.tokens.shape == r2.tokens.shape == (2, 4)
