"""`python -m analysis.report RUNS [RUNS ...] --out REPORT_DIR` (= `dpscope report`)."""

import sys

try:  # Ctrl-C while the libraries load is one line too
    from analysis.cli.report import main
except KeyboardInterrupt:
    print("python -m analysis.report: interrupted (Ctrl-C) — nothing was written", file=sys.stderr)
    sys.exit(130)

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
