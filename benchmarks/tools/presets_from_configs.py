"""Decode-shape presets read off transformers' model definitions (not assumed): one layer's linears and
routed experts, from a 1-2 layer meta-device model of each config.

    python3 benchmarks/tools/presets_from_configs.py            # prints the JSON entries
    python3 benchmarks/tools/presets_from_configs.py --write    # merges them into lowbit/bench/presets.json

Which layer: the last one (Llama: any; Qwen3-Coder-Next: a gated-DeltaNet layer, 3 of every 4;
GLM-4.7-Flash: a sparse MLA layer, 46 of 47). ``real-shapes`` is the set of distinct dense shapes
over all of them (the issue-14 "shapes the presets do not name" set).
"""

import argparse
import json
from pathlib import Path

import torch
from torch import nn

PRESETS = Path(__file__).resolve().parents[2] / "lowbit" / "bench" / "presets.json"
SMOLLM2 = ("LlamaConfig", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                               num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True))
MODELS = {  # preset name -> (config source, layers to build, which layer, note)
    "llama-3-8b-hf": ("llama-3-8b", 1, 0, "every layer"),
    "qwen3-30b-a3b": ("qwen3-30b-a3b", 1, 0, "every layer: attention + 128 experts of 2048x768, top-8"),
    "qwen3-coder-next-hf": ("qwen3-coder-next", 1, 0, "a gated-DeltaNet layer (3 of 4; the 4th has gated full "
                            "attention: q 2048x8192, k/v 2048x512, o 4096x2048) + 512 experts of 2048x512, top-10 "
                            "+ a gated shared expert of 512"),
    "glm-4.7-flash-hf": ("glm-4.7-flash", 2, 1, "a sparse layer (46 of 47): MLA attention + 64 experts of "
                         "2048x1536, top-4 + a shared expert"),
    "smollm2-135m": (None, 1, 0, "every layer (SmolLM2-135M-Instruct, the embedded demo model)"),
}


def layer_shapes(cfg_name, layers, which):
    import transformers

    from lowbit.hf import sources
    from lowbit.nn import fused_experts_layout

    cls, kw = SMOLLM2 if cfg_name is None else sources.RANDOM_CONFIGS[cfg_name]
    cfg = getattr(transformers, cls)(**{**kw, "num_hidden_layers": layers})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    layer = model.model.layers[which]
    linears, moe = [], None
    for name, mod in layer.named_modules():
        if isinstance(mod, nn.Linear):
            linears.append({"name": name, "k_in": mod.in_features, "n": mod.out_features})
        layout = fused_experts_layout(mod) if not isinstance(mod, nn.Linear) else None
        if layout:
            e, h, i = layout
            top_k = getattr(cfg, "num_experts_per_tok")
            moe = {"experts": e, "top_k": top_k, "linears": [
                {"name": "expert.gate", "k_in": h, "n": i}, {"name": "expert.up", "k_in": h, "n": i},
                {"name": "expert.down", "k_in": i, "n": h}]}
    # router gates (N = experts or 1) are tiny and not where decode time goes: keep only N >= 16
    linears = [x for x in linears if x["n"] >= 16]
    return linears, moe, cls, kw


def _format(data: dict) -> str:
    """The presets file's layout: one linear per line."""
    one = lambda x: json.dumps(x, separators=(", ", ": "))  # noqa: E731
    lines = ["{", f'  "_doc": {json.dumps(data["_doc"])},']
    if "default" in data:
        lines.append(f'  "default": {json.dumps(data["default"])},')
    lines.append('  "presets": {')
    names = list(data["presets"])
    for i, name in enumerate(names):
        p = data["presets"][name]
        lines += [f"    {json.dumps(name)}: {{", f'      "source": {json.dumps(p["source"])},', '      "linears": [']
        lines += [f"        {one(x)}" + ("," if j + 1 < len(p["linears"]) else "") for j, x in enumerate(p["linears"])]
        if p.get("moe"):
            m = p["moe"]
            lines += ["      ],", '      "moe": {', f'        "experts": {m["experts"]},', f'        "top_k": {m["top_k"]},',
                      '        "linears": [']
            lines += [f"          {one(x)}" + ("," if j + 1 < len(m["linears"]) else "") for j, x in enumerate(m["linears"])]
            lines += ["        ]", "      }"]
        else:
            lines += ["      ]"]
        lines += ["    }" + ("," if i + 1 < len(names) else "")]
    return "\n".join(lines + ["  }", "}"]) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    out, shapes = {}, {}
    for preset, (cfg_name, layers, which, note) in MODELS.items():
        linears, moe, cls, kw = layer_shapes(cfg_name, layers, which)
        entry = {"source": f"transformers 5.17 {cls} ({cfg_name or 'SmolLM2-135M config'}, lowbit.hf.sources): {note}; "
                           "shapes read from the model's modules by benchmarks/tools/presets_from_configs.py",
                 "linears": linears}
        if moe:
            entry["moe"] = moe
        out[preset] = entry
        for x in linears + (moe["linears"] if moe else []):
            shapes.setdefault((x["k_in"], x["n"]), f"{preset} {x['name']}")
    out["real-shapes"] = {
        "source": "every distinct decode shape of the *-hf presets, qwen3-30b-a3b and smollm2-135m (one of the "
                  "models that has it is named); generated by benchmarks/tools/presets_from_configs.py",
        "linears": [{"name": f"{k}x{n} ({who})", "k_in": k, "n": n} for (k, n), who in sorted(shapes.items())]}
    if args.write:
        data = json.loads(PRESETS.read_text())
        data["presets"].update(out)
        data.setdefault("default", ["qwen3-coder-next", "glm-4.7-flash", "llama-3-8b", "llama-3-70b"])
        PRESETS.write_text(_format(data))
        print(f"wrote {len(out)} presets to {PRESETS}")
    else:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
