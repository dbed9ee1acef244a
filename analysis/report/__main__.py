"""`python -m analysis.report RUNS [RUNS ...] --out REPORT_DIR` (= `dpscope report`)."""

import sys

from analysis.cli.report import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
