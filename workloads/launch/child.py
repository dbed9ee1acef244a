"""How dpscope's commands start their Python children so that they work from any folder.

Every command that starts a `python -m ...` child (the launcher, sweep, tune, bench-comm,
gpu-check and the benches) runs it in the user's own working directory and with the environment
from `child_env`:

- the child inherits the folder the user ran the command in (no `cwd=`), so a relative path
  means what it meant to the user, and `python -m` puts that folder first on the child's
  `sys.path`: the user's own modules import there, as they would in a script of theirs;
- dpscope's package root is prepended to PYTHONPATH (the user's entries kept after it), so the
  child imports this dpscope from whichever folder it runs in. An installed dpscope (in
  site-packages) is importable anyway and is not put ahead of the standard library;
- `DPSCOPE_RUN_ROOT_PID` names the starting process, so that the host-load meters
  (profiler/runfolder/hostload.py) count its whole tree as the run's own CPU, not as other load.

Paths the user gives (`--runs-dir`, `--data-dir`, `--rdzv-file`, output files) go through
`user_path` once, before anything starts, so that every child and every message sees the same
absolute path.

`die_with_parent` (Linux: PR_SET_PDEATHSIG) makes a child end when the process that started it
dies, even by SIGKILL: the launcher's direct child runs under workloads.launch.guard, and each
training rank sets it itself, so a killed launcher leaves no training behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import site
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from profiler.runfolder.hostload import RUN_ROOT_ENV

__all__ = [
    "PACKAGE_ROOT",
    "child_env",
    "die_with_parent",
    "set_subreaper",
    "stop_process",
    "user_path",
]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    """prctl(2) on Linux; False elsewhere or when it fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send `sig` to this process when its parent dies (Linux; False where it
    cannot). A parent that died already (this process was reparented) ends it at once."""
    parent = os.getppid()
    if not _prctl(_PR_SET_PDEATHSIG, int(sig)):
        return False
    if os.getppid() != parent:  # the parent died between fork and here: the signal never comes
        os.kill(os.getpid(), sig)
    return True


def set_subreaper() -> bool:
    """Become the child subreaper (Linux): descendants orphaned below this process are
    reparented to it instead of init, so the launcher still sees (and ends) a daemon that a
    training left behind."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The folder that holds dpscope's top-level packages (workloads/, analysis/, profiler/)."""


def _on_default_path(root: Path) -> bool:
    """Whether Python finds packages in `root` without PYTHONPATH (an installed dpscope)."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return any(Path(d).resolve() == root for d in dirs if d)


def child_env(env: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """`env` (default: this process's environment) plus `extra`, with dpscope's package root
    first on PYTHONPATH and the user's own PYTHONPATH entries kept, in order, after it."""
    out = dict(os.environ if env is None else env)
    out.update(extra)
    out[RUN_ROOT_ENV] = str(os.getpid())
    if _on_default_path(PACKAGE_ROOT):
        return out
    theirs = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    # Empty entries (an unset PYTHONPATH, "a::b") add the working folder, which `python -m`
    # puts first on sys.path anyway.
    kept = [p for p in theirs if Path(p).resolve() != PACKAGE_ROOT]
    out["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), *kept])
    return out


def user_path(path: str | os.PathLike[str]) -> Path:
    """A path the user gave, made absolute against the folder the command was run in.

    Symlinks are kept as given (only `.` and `..` are folded), so messages show the user's names.
    """
    return Path(os.path.abspath(path))


def stop_process(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Stop a child started with Popen: SIGTERM, then SIGKILL if it is still there after
    `timeout_s`; reaped either way (no zombie left behind)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
