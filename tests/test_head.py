"""The decode step's unquantized lm_head through lowbit's dense GEMV (lowbit.hf.head): which heads it takes, and
that everything it does not take -- CPU rows, prefill rows, a switched-off flag -- is nn.Linear's own forward, bit
for bit, with the parameters and state dict unchanged. (tests/gpu/test_head_gpu.py checks the GPU rows.)"""

import pytest
import torch
from torch import nn

from lowbit.hf import head as hf_head

from .tiny_models import llama


def _model(tie=False):
    cfg, cls = llama(tie=tie)
    torch.manual_seed(0)
    return cls(cfg).eval()


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_cpu_head_is_left_alone(tie):
    model = _model(tie)
    head = model.get_output_embeddings()
    keys = set(model.state_dict())
    assert not hf_head.use_dense_head(model)
    assert type(head) is nn.Linear and set(model.state_dict()) == keys


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9])
@pytest.mark.parametrize("bias", [False, True])
def test_switched_head_off_the_gpu_is_nn_linear(rows, bias):
    """A switched head (as on a GPU) computes nn.Linear's output exactly wherever the GEMV does not run."""
    gen = torch.Generator().manual_seed(rows)
    lin = nn.Linear(64, 96, bias=bias)
    x = torch.randn(2, rows, 64, generator=gen)
    want = lin(x)
    lin.__class__ = hf_head.LowbitDenseHead
    assert isinstance(lin, nn.Linear)
    got = lin(x)
    assert torch.equal(got, want) and not got.isnan().any()


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_empty_input_features_are_nn_linear():
    lin = nn.Linear(0, 4)
    want = lin(torch.zeros(2, 0))
    lin.__class__ = hf_head.LowbitDenseHead
    assert torch.equal(lin(torch.zeros(2, 0)), want)


def test_what_is_not_a_plain_head():
    class Mine(nn.Linear):
        pass

    hooked = nn.Linear(8, 8).bfloat16()
    hooked.register_forward_hook(lambda *a: None)
    patched = nn.Linear(8, 8).bfloat16()
    patched.forward = lambda x: x
    cases = {"not an nn.Linear": Mine(8, 8), "forward hooks": hooked, "a forward of its own": patched,
             "torch.float32": nn.Linear(8, 8), "not contiguous": nn.Linear(8, 8).bfloat16(),
             "on cpu": nn.Linear(8, 8).bfloat16()}
    cases["not contiguous"].weight = nn.Parameter(torch.randn(8, 8, dtype=torch.bfloat16).t())
    for why, head in cases.items():
        assert why in hf_head.refusal(head), (why, hf_head.refusal(head))
