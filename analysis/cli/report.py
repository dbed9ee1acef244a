"""`dpscope report RUNS [RUNS ...] --out REPORT_DIR` (also `python -m analysis.report`).

Bad input ends with one line naming the file or argument and what to do (exit code 2), never a
traceback; tracebacks are left for bugs (profiler.runfolder.errors.run_command). Ctrl-C is one line too
(exit code 130) and leaves the previous report whole (analysis/report/outfolder.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.runs.quiet import add_quiet_argument
from analysis.trace.clocks import add_clock_align
from profiler.runfolder.errors import OneLineParser, run_command

__all__ = ["build_parser", "main"]


def build_parser(prog: str = "python -m analysis.report") -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Write one self-contained HTML report (plus summary.json and CSV tables) "
        "from run folders.",
    )
    parser.add_argument(
        "runs", nargs="+", type=Path, help="folders holding run folders, or run folders themselves"
    )
    parser.add_argument("--out", type=Path, default=Path("reports"), help="report folder")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument(
        "--memory-budget-gib",
        type=float,
        default=None,
        help="per-rank memory the largest-model-that-fits estimate uses (default: the device's "
        "memory; CPU: the host's RAM ÷ ranks per node)",
    )
    add_clock_align(parser)
    add_quiet_argument(parser)
    return parser


def main(argv: list[str] | None = None, *, prog: str = "python -m analysis.report") -> int:
    args = build_parser(prog).parse_args(argv)

    def body() -> int:
        # Loaded here (matplotlib takes seconds), so that a Ctrl-C meanwhile is one line too.
        from analysis.report.build import build_report
        from analysis.runs.family import budget_bytes

        budget = budget_bytes(args.memory_budget_gib)  # a bad budget is one line before any work
        files = build_report(
            args.runs,
            args.out,
            progress=not args.no_progress,
            clock_align=args.clock_align,
            memory_budget_bytes=budget,
            quiet_frac=args.quiet_frac,
        )
        print(f"report: {files.index_html}")
        print(f"open:   {files.index_html.resolve().as_uri()}")
        return 0

    # The folder swap undoes itself on any interruption before the report line is printed: what
    # is left is what was there before, said as it is.
    had = (Path(args.out) / "index.html").is_file()
    left = (
        f"the previous report in {args.out} is whole"
        if had
        else f"no report was written to {args.out}"
    )
    return run_command(prog, body, interrupted=left)
