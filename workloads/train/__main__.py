"""`python -m workloads.train`: the training entrypoint torchrun starts (see workloads/train/loop.py)."""

import sys

from profiler.runfolder.errors import import_main

sys.exit(import_main("workloads.train.loop", "python -m workloads.train")())
