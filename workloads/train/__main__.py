"""`python -m workloads.train`: the training entrypoint torchrun starts (see workloads/train/loop.py)."""

import sys

from workloads.train.loop import main

sys.exit(main())
