"""`python -m workloads.launch.guard MODULE ARGS...`: run `python -m MODULE ARGS` in a process
that gets SIGTERM when its parent (the launcher) dies, even by SIGKILL (Linux PR_SET_PDEATHSIG,
workloads.launch.child.die_with_parent).

The launcher starts its one child (torchrun, or the training itself) through it, so that killing
the launcher stops the job: torchrun stops its ranks on SIGTERM, and each rank of dpscope's own
training also dies with torchrun (workloads.train). Nothing else changes: MODULE runs as
`__main__` with `sys.argv = [MODULE's path, *ARGS]`, exactly as `python -m` runs it.
"""

from __future__ import annotations

import runpy
import signal
import sys

from workloads.launch.child import die_with_parent

__all__ = ["guarded", "main"]


def guarded(cmd: list[str]) -> list[str]:
    """`cmd` run through the guard when it is `python -m MODULE ...`; any other command as is."""
    if len(cmd) >= 3 and cmd[0] == sys.executable and cmd[1] == "-m":
        return [cmd[0], "-m", "workloads.launch.guard", *cmd[2:]]
    return cmd


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m workloads.launch.guard MODULE [ARGS...]")
    die_with_parent(signal.SIGTERM)
    module, *args = sys.argv[1:]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
