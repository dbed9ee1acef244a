"""`python -m workloads.launch`: the launcher behind `make profile-*` (workloads/launch/launcher.py)."""

import sys

from workloads.launch.launcher import main

sys.exit(main())
