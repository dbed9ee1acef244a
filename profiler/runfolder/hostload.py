"""How busy the machine was while a run measured its steps: run.json `env.host_load`.

Fields (docs/reference/run-folder.md):
- `load_avg_1m_start`, `load_avg_1m_end`: the 1-minute load average (os.getloadavg) when the
  first measured (non-warm-up) step starts and when the run's last step has ended.
- `other_cpu_cores_mean`: cores' worth of CPU that processes other than the run's own used
  between those two points: (Δ busy CPU seconds of the whole machine − Δ CPU seconds of the run's
  own processes) ÷ Δ wall seconds, at least 0 (psutil). Busy = user + nice + system + irq +
  softirq (guest time is already inside user on Linux). The run's own processes: this one and its
  children, and under torchrun the agent and every rank it started (each rank's CPU is the run's).
- `steal_pct`: Δ steal ÷ Δ total CPU time × 100, where the OS reports steal (Linux), else null.
- `cores`: logical cores (psutil.cpu_count()).
- `own_threads`: threads of the run's own processes at the end.

Only the run's rank 0 measures (one host). Imports psutil only, so any loop can use it.

A run is busy when `other_cpu_cores_mean` > BUSY_OTHER_CORES_FRAC × `cores` (`is_busy`): the
report's findings and verdict (THRESHOLDS `busy_other_cores_frac`) and the projection's comm-run
warning all read this one rule.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import psutil

__all__ = ["BUSY_OTHER_CORES_FRAC", "HostLoadMeter", "is_busy"]

# Other processes using more than this share of the cores while a run measured: throughput unreliable.
BUSY_OTHER_CORES_FRAC = 0.5


def is_busy(load: Mapping[str, Any] | None) -> bool:
    """True when env.host_load `load` says other processes used more than
    BUSY_OTHER_CORES_FRAC of the cores; False without `load` or its numbers (older runs)."""
    if not load or load.get("other_cpu_cores_mean") is None or not load.get("cores"):
        return False
    return load["other_cpu_cores_mean"] > BUSY_OTHER_CORES_FRAC * load["cores"]


def _own_root() -> psutil.Process:
    """The process whose tree is the run: the torchrun agent for a torchrun rank, else this one."""
    me = psutil.Process()
    if "TORCHELASTIC_RUN_ID" in os.environ:  # set by torchrun for every rank it starts
        parent = me.parent()
        if parent is not None:
            return parent
    return me


def _tree_cpu_s(root: psutil.Process) -> tuple[dict[int, float], int]:
    """CPU seconds (user + system) of every process in `root`'s tree by pid, and their threads."""
    cpu, threads = {}, 0
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        procs = [root]
    for p in procs:
        try:
            with p.oneshot():
                t = p.cpu_times()
                cpu[p.pid] = t.user + t.system
                threads += p.num_threads()
        except psutil.Error:  # exited between listing and reading
            continue
    return cpu, threads


def _system() -> tuple[float, float, float | None]:
    """(busy, total, steal) CPU seconds of the whole machine since boot (steal None off Linux)."""
    t = psutil.cpu_times()
    busy = sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))
    guest = getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
    return busy, sum(t) - guest, getattr(t, "steal", None)


class HostLoadMeter:
    """`start()` at the first measured step, `stop()` after the last: `result` is env.host_load."""

    def __init__(self) -> None:
        self.root = _own_root()
        self.result: dict | None = None
        self._start: tuple | None = None

    def start(self) -> None:
        own, _ = _tree_cpu_s(self.root)
        self._start = (time.perf_counter(), _system(), own, os.getloadavg()[0])

    def stop(self) -> dict | None:
        """env.host_load (the module docstring); None when `start` never ran."""
        if self._start is None:
            return None
        wall0, (busy0, total0, steal0), own0, load0 = self._start
        own1, threads = _tree_cpu_s(self.root)
        busy1, total1, steal1 = _system()
        wall = max(time.perf_counter() - wall0, 1e-9)
        # a process the run started after `start` counts from 0; one that ended is lost
        own = sum(v - own0.get(pid, 0.0) for pid, v in own1.items())
        steal = None
        if steal0 is not None and steal1 is not None and total1 > total0:
            steal = min(100.0, max(0.0, 100 * (steal1 - steal0) / (total1 - total0)))
        self.result = {
            "load_avg_1m_start": load0,
            "load_avg_1m_end": os.getloadavg()[0],
            "other_cpu_cores_mean": max(0.0, (busy1 - busy0 - own) / wall),
            "steal_pct": steal,
            "cores": psutil.cpu_count() or 1,
            "own_threads": threads,
        }
        return self.result
