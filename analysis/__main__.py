"""Entry point of `python -m analysis` (see analysis/cli/main.py)."""

import sys

from analysis.cli.main import main

sys.exit(main())
