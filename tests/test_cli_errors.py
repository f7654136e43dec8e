"""The command line as a user types it: every mistake is one line on stderr, exit status 2, before any model
is loaded (each of these returns in the time it takes to import torch). The commands run as subprocesses, a few at
a time (one per core): each is mostly that import, and 27 of them one after another took two minutes of the suite."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

CASES = [
    ("generate --model /nonexistent", "neither an existing path nor a hub name"),
    ("generate --model random:foo", "unknown random model 'random:foo'"),
    ("generate --max-new-tokens -5", "argument --max-new-tokens: must be >= 1, got -5"),
    ("generate --batch 0", "argument --batch: must be >= 1"),
    ("generate --load {empty}", "no lowbit_model.json there"),
    ("generate --format nvfp4 --lm-head-bits 3", "--format nvfp4: format='nvfp4' is 4-bit E2M1 with E4M3 block scales; bits are kbit options"),
    ("generate --format sbvr --fuse", "--fuse: --format sbvr has no fused module"),
    ("generate --layers 2", "--layers takes a count >= 1 and applies to random:<name> models only"),
    ("generate --device tpu", "is not a device"),
    ("eval --bits 7", "--bits takes comma-separated numbers from 2..5, got '7'"),
    ("eval --bits 4,x", "--bits takes comma-separated numbers from 2..5"),
    ("generate --bits 7", "argument --bits: invalid choice"),
    ("generate --format int4", "--format takes kbit or nvfp4 or sbvr, or several comma-separated, got 'int4'"),
    ("generate --format kbit,kbit", "--format takes kbit or nvfp4 or sbvr"),
    ("generate --format kbit,nvfp4 --save {empty}", "--load / --save take one --format"),
    ("generate --calibration-samples 8", "--calibration-samples: options of --method gptq"),
    ("generate --method gptq --calibration /nonexistent.txt", "--calibration /nonexistent.txt: no such file"),
    ("generate --method awq", "argument --method: invalid choice"),
    ("eval --method awq", "--method takes rtn, gptq or rtn,gptq, got 'awq'"),
    ("eval --calibration-samples 4", "--calibration-samples takes a count >= 1, with --method gptq"),
    ("generate --codebook-rounds 2", "--codebook-rounds: options of --method gptq"),
    ("generate --method gptq --bits 4 --codebook-rounds 2", "--codebook-rounds refits a fitted codebook: add --codebook fit"),
    ("generate --method gptq --bits 2 --codebook default --codebook-rounds 2", "--codebook-rounds refits a fitted codebook"),
    ("generate --format nvfp4 --rotate", "--rotate: --format nvfp4 has no rotated weights"),
    ("eval --codebook-rounds 2", "--codebook-rounds takes a count >= 1, with --method gptq"),
    ("eval --only nosuchrow", "--only: no rows named ['nosuchrow']"),
    ("eval --out /nonexistent/dir/eval.json", "--out /nonexistent/dir/eval.json: its folder does not exist"),
]


def _run(args: str, empty) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lowbit", *args.format(empty=empty).split()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def ran(request, tmp_path_factory) -> dict:
    """The selected cases' results, their commands run at once (``{empty}``: an empty folder of the case's own).
    Under pytest-xdist, where a worker does not know which cases it will get, each case runs when it is asked for."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        class OnDemand(dict):
            def __missing__(self, args):
                return _run(args, tmp_path_factory.mktemp("empty"))

        return OnDemand()
    wanted = [item.callspec.params["args"] for item in request.session.items
              if item.originalname == "test_user_error_is_one_line_exit_2" and item.module is request.module]
    empties = [tmp_path_factory.mktemp("empty") for _ in wanted]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(zip(wanted, pool.map(_run, wanted, empties)))


@pytest.mark.parametrize("args, message", CASES, ids=[c[0] for c in CASES])
def test_user_error_is_one_line_exit_2(args, message, ran):
    p = ran[args]
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
