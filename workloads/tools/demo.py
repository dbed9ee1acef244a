"""`dpscope demo` (what `make demo` runs): profile a small workload in every mode this machine
supports, for two seeds (so the report has error bars), then write the report.

The defaults (smallcnn, 24 steps, seeds 0 and 1) finish in about a minute on a quiet 2-core CPU. Any
other option is a `dpscope profile` option, checked before anything runs, and wins over the
demo's defaults: `dpscope demo --model resnet18 --max-steps 50`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from profiler.errors import OneLineParser, UserError, run_command

__all__ = ["DEMO_DEFAULTS", "build_parser", "main"]

# Launcher options the demo sets unless the user passes their own (a later option wins).
DEMO_DEFAULTS = ("--mode", "all", "--model", "smallcnn", "--max-steps", "24")


class DemoError(UserError):
    """A bad demo argument; one line that says what to do."""


def build_parser(prog: str = "python -m workloads.tools.demo") -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Profile smallcnn (24 steps) in every mode this machine supports for two "
        "seeds, then write the report. Other options are `dpscope profile` options and win over "
        "these defaults (e.g. --model resnet18 --max-steps 50).",
    )
    parser.add_argument("--seeds", default="0 1", help='seeds, one run per mode each (e.g. "0 1")')
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"), help="folder of run folders")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="report folder")
    return parser


def _seeds(text: str) -> list[str]:
    words = text.split()
    if not words or not all(w.isdigit() for w in words):
        raise DemoError(f'--seeds {text!r}: give seeds as non-negative integers, e.g. "0 1"')
    return words


def _demo(args: argparse.Namespace, extra: list[str], prog: str) -> int:
    from analysis.cli import report
    from workloads.launch import launcher

    seeds = _seeds(args.seeds)
    _, unknown = launcher.build_parser().parse_known_args(extra)
    if unknown:
        raise DemoError(
            f"unknown option(s) {' '.join(unknown)}; see `dpscope profile --help` for the options "
            "the demo passes on"
        )
    for seed in seeds:
        code = launcher.main(
            [*DEMO_DEFAULTS, *extra, "--seed", seed, "--runs-dir", str(args.runs_dir)],
            prog=prog,
        )
        if code != 0:
            return code
    return report.main([str(args.runs_dir), "--out", str(args.out)], prog=prog)


def main(argv: list[str] | None = None, *, prog: str = "python -m workloads.tools.demo") -> int:
    args, extra = build_parser(prog).parse_known_args(argv)
    return run_command(prog, lambda: _demo(args, extra, prog))


if __name__ == "__main__":
    import sys

    sys.exit(main())
