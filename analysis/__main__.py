"""Entry point of `python -m analysis` (see analysis/cli/main.py)."""

import sys

try:  # Ctrl-C while the libraries load is one line too
    from analysis.cli.main import main
except KeyboardInterrupt:
    print("python -m analysis: interrupted (Ctrl-C) — nothing was written", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
