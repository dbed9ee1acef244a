"""CLI: `python -m analysis.report RUNS [RUNS ...] --out REPORT_DIR`.

Bad input ends with one line naming the file or argument and what to do (exit code 2), never a
traceback; tracebacks are left for bugs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.report",
        description="Write one self-contained HTML report (plus summary.json and CSV tables) "
        "from run folders.",
    )
    parser.add_argument(
        "runs", nargs="+", type=Path, help="folders holding run folders, or run folders themselves"
    )
    parser.add_argument("--out", type=Path, default=Path("reports"), help="report folder")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    args = parser.parse_args(argv)
    try:
        # Loaded here (matplotlib takes seconds) so that a Ctrl-C meanwhile is one line too.
        from analysis.report.build import ReportError, build_report
    except KeyboardInterrupt:
        print("report: interrupted (Ctrl-C) — nothing was written", file=sys.stderr)
        return 130
    try:
        files = build_report(args.runs, args.out, progress=not args.no_progress)
    except ReportError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line; the folder swap undid itself first
        print(f"report: interrupted (Ctrl-C) — the previous report in {args.out} is whole",
              file=sys.stderr)  # fmt: skip
        return 130
    print(f"report: {files.index_html}")
    print(f"open:   {files.index_html.resolve().as_uri()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
