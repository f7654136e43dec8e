"""The README as a stranger uses it: every Python snippet runs as written (CPU here), every `lowbit`
command line parses, and the headline table is the one benchmarks/headline.py makes from the kept JSON."""

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from lowbit.cli import make_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


SNIPPETS = _blocks("python")


def test_readme_has_the_snippets():
    assert len(SNIPPETS) >= 2 and len(_blocks("bash")) >= 2


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_python_snippet_runs_as_written(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # snippets write files (model-kbit4/) into the working directory
    exec(compile(SNIPPETS[index], f"README.md python block {index + 1}", "exec"), {"__name__": "__readme__"})
    if "print(skeleton(ids).logits.shape)" in SNIPPETS[index]:
        assert "torch.Size([1, 3, 1000])" in capsys.readouterr().out


def _command_lines() -> list[list[str]]:
    lines = []
    for block in _blocks("bash"):
        for line in block.splitlines():
            for part in line.split("#", 1)[0].split(";"):  # "lowbit ... # comment", "a; b"
                words = shlex.split(part)
                if words[:1] == ["lowbit"]:
                    lines.append(words[1:])
    return lines


@pytest.mark.parametrize("argv", _command_lines(), ids=lambda a: " ".join(a))
def test_lowbit_command_in_readme_parses(argv):
    args = make_parser().parse_args(argv)
    if args.command == "generate":
        from lowbit.hf.generate import parse_formats

        parse_formats(args.fmt)


def test_headline_table_is_generated_from_the_kept_numbers():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import headline
    finally:
        sys.path.pop(0)
    kept = json.loads((ROOT / "benchmarks" / "results" / "headline.json").read_text())
    block = re.search(r"<!-- headline:start -->\n(.*?)\n<!-- headline:end -->", README, re.S)
    assert block is not None
    assert block.group(1) == headline.table(kept), "run: python3 benchmarks/headline.py --from " \
                                                   "benchmarks/results/headline.json --write-readme"


def test_device_check_covers_every_gpu_test_file():
    """`SUITE=a..e bash benchmarks/device_check.sh` is how the whole GPU suite runs in 10-minute device calls:
    a new GPU test file must be in one of its parts."""
    script = (ROOT / "benchmarks" / "device_check.sh").read_text()
    listed = set(re.findall(r"tests/gpu/(test_\w+\.py)", script))
    files = {p.name for p in (ROOT / "tests" / "gpu").glob("test_*.py")}
    assert files <= listed, f"not in any SUITE of benchmarks/device_check.sh: {sorted(files - listed)}"
