"""`python -m workloads.launch`: the launcher behind `make profile-*` (workloads/launch/launcher.py)."""

import sys

from profiler.runfolder.errors import import_main

sys.exit(import_main("workloads.launch.launcher", "python -m workloads.launch")())
