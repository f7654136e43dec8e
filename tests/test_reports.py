"""What the reports say: the expected-quality line, the quantize summary's words, and the bytes column
counting MoE expert blocks before and after quantization."""

import torch

import lowbit
from lowbit.hf.generate import _linear_bytes, expected_quality

from .tiny_models import build


def test_expected_quality_warns_at_low_bits():
    assert expected_quality("kbit3").startswith("WARNING: round-to-nearest")
    assert "KL 12.2 nats" in expected_quality("kbit2")
    four = expected_quality("kbit4")
    assert four is not None and "WARNING" not in four and "KL 0.246" in four
    assert expected_quality("kbit9") is None


def test_summary_counts_linear_layers_and_fusion():
    model = build("llama", 0)
    r = lowbit.quantize_model(model, bits=4, progress=False)
    # 2 layers x (q, k, v, o, gate, up, down) = 14 linears; q|k|v and gate|up fused -> 4 weights per layer
    assert r.linears == 14 and len(r.layers) == 8
    assert r.summary().startswith("quantized 14 linear layers to kbit4 (stored as 8 weights: 10 of them fused into 4)")


def test_weight_bytes_count_expert_blocks():
    model = build("qwen3_moe", 0)
    linears_only = sum(m.weight.nbytes for m in model.modules() if isinstance(m, torch.nn.Linear))
    experts = sum(m.gate_up_proj.nbytes + m.down_proj.nbytes for m in model.modules() if hasattr(m, "gate_up_proj"))
    assert experts > 0 and _linear_bytes(model) == linears_only + experts
    lowbit.quantize_model(model, bits=4, progress=False)
    after = _linear_bytes(model)
    assert 0 < after < linears_only + experts


def test_eval_rows_view_prints_each_row_then_the_table(capsys):
    """Not a terminal (a log, a pipe): a plain line per finished row, then the rich table."""
    from lowbit.hf.evaluate import _RowsView

    view = _RowsView(2, prompts=False)
    rows = {"kbit4": {"ppl": 17.25, "ppl_ref": 13.5, "kl": 0.246, "top1": 0.76},
            "kbit5": {"ppl": 14.1, "ppl_ref": 13.5, "kl": 0.076, "top1": 0.87}}
    for name, row in rows.items():
        view.scoring(name)
        view.add(name, row, None)
        assert name in capsys.readouterr().out.splitlines()[-1]
    view.close()
    table = capsys.readouterr().out
    assert "KL (nats)" in table and "0.2460" in table and "0.0760" in table and "87.0%" in table
