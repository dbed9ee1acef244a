"""Entry point of `python -m analysis` (see analysis/cli/main.py)."""

import sys

from profiler.runfolder.errors import import_main

sys.exit(import_main("analysis.cli.main", "python -m analysis")())
