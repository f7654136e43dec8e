"""``lowbit`` command line: ``lowbit build`` (compile the CUDA library), ``lowbit bench`` (benchmarks),
``lowbit tune`` (re-tune the fp16/bf16 GEMV for this GPU), ``lowbit generate`` (the main job:
quantize a model and decode with it)."""

from __future__ import annotations

import argparse
import sys
import traceback

from .errors import UsageError
from .kernels import build as _build


def _cmd_build(args: argparse.Namespace) -> int:
    archs = _build.DEFAULT_ARCHS if args.arch == "default" else tuple(a.strip() for a in args.arch.split(","))
    try:
        path = _build.build(archs, force=args.force, verbose=args.verbose, jobs=args.jobs,
                            progress=lambda name, done, total: print(f"[{done}/{total}] {name}", file=sys.stderr, flush=True))
    except _build.BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: what is wrong and where to look (exit status 2, no usage dump)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="lowbit", description="low-bit weight kernels for LLM decoding")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile the CUDA library (cached by source hash and arch)")
    b.add_argument("--arch", default="default", help="comma-separated archs, e.g. sm_90a,sm_89 (default: %(default)s = sm_80,sm_89,sm_90a)")
    b.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    b.add_argument("--verbose", action="store_true", help="print nvcc's resource report (-Xptxas -v)")
    b.add_argument("--jobs", type=_positive_int, default=None, help="files compiled at once (default: one per CPU)")
    b.set_defaults(func=_cmd_build)
    from .bench.cli import add_parser as _add_bench

    _add_bench(sub)
    from .bench.tune import add_parser as _add_tune

    _add_tune(sub)
    from .hf.generate import add_parser as _add_generate  # imports transformers only when run

    _add_generate(sub)
    from .hf.evaluate import add_parser as _add_eval

    _add_eval(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run a command. A user's mistake (:class:`lowbit.errors.UsageError`) prints one line and returns 2;
    anything else unexpected prints its traceback and a line asking to report it."""
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as e:
        print(f"lowbit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lowbit {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print(f"lowbit {args.command}: internal error (traceback above). This is a bug in lowbit: please report it "
              "with the command line you ran.", file=sys.stderr)
        return 1
