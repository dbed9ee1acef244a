"""`python -m analysis.report RUNS [RUNS ...] --out REPORT_DIR` (= `dpscope report`)."""

import sys

from profiler.runfolder.errors import import_main

main = import_main("analysis.cli.report", "python -m analysis.report")

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
