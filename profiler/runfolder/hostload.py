"""How busy the machine was while a run measured its steps: run.json `env.host_load`, and per
step the steps.csv column `other_cpu_cores`.

Fields of env.host_load (docs/reference/run-folder.md):
- `load_avg_1m_start`, `load_avg_1m_end`: the 1-minute load average (os.getloadavg) when the
  warm-up steps are done (before the first measured step) and when the run's last step has ended.
- `other_cpu_cores_mean`: cores' worth of CPU that processes other than the run's own used
  between those two points: (Δ busy CPU seconds of the whole machine − Δ CPU seconds of the run's
  own processes) ÷ Δ wall seconds, at least 0 (psutil). Busy = user + nice + system + irq +
  softirq (guest time is already inside user on Linux). The run's own processes: the process tree
  the dpscope launcher started (RUN_ROOT_ENV names the launcher; every rank, torchrun's agent,
  DataLoader workers), else under torchrun the agent and every rank it started, else this process
  and its children.
- `steal_pct`: Δ steal ÷ Δ total CPU time × 100, where the OS reports steal (Linux), else null.
- `cores`: logical cores (psutil.cpu_count()).
- `own_threads`: threads of the run's own processes at the end.

steps.csv `other_cpu_cores` (`StepLoadMeter`): the same quantity over one step, in cores: from the
end of the previous step (the run's start, for its first) to the end of this one, or over the last
STEP_LOAD_WINDOW_S when that is shorter, since the OS counts CPU time in 10 ms ticks and a shorter
window would mostly measure the tick. Only the run's rank 0 measures (one host), so the other
ranks' cells are empty. Imports psutil only, so any loop can use it.

A run is busy when `other_cpu_cores_mean` > BUSY_OTHER_CORES_FRAC × `cores` (`is_busy`): the
report's findings and verdict (THRESHOLDS `busy_other_cores_frac`) and the projection's comm-run
warning all read this one rule. A step is quiet when its `other_cpu_cores` ≤
QUIET_OTHER_CORES_FRAC × the cores the run uses (profiler.runfolder.quiet).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import psutil

__all__ = [
    "BUSY_OTHER_CORES_FRAC",
    "QUIET_OTHER_CORES_FRAC",
    "RUN_ROOT_ENV",
    "STEP_LOAD_WINDOW_S",
    "HostLoadMeter",
    "StepLoadMeter",
    "is_busy",
    "own_root",
]

# Other processes using more than this share of the cores while a run measured: throughput unreliable.
BUSY_OTHER_CORES_FRAC = 0.5
# A step is quiet when other processes used at most this many cores per core the run uses.
QUIET_OTHER_CORES_FRAC = 0.25
# The shortest window a step's `other_cpu_cores` is measured over (CPU time comes in 10 ms ticks).
STEP_LOAD_WINDOW_S = 0.2
# The run's process tree is listed again at most this often (listing reads every process of the
# machine: milliseconds on a busy host), and at each new epoch (new DataLoader workers).
TREE_RELIST_S = 10.0
# A process's start time comes in clock ticks: one that started this close before a reading
# may have started after it.
START_TICK_S = 0.011
# Set by the launcher for the processes it starts: its own pid, the root of the run's tree.
RUN_ROOT_ENV = "DPSCOPE_RUN_ROOT_PID"


def is_busy(load: Mapping[str, Any] | None) -> bool:
    """True when env.host_load `load` says other processes used more than
    BUSY_OTHER_CORES_FRAC of the cores; False without `load` or its numbers (older runs)."""
    if not load or load.get("other_cpu_cores_mean") is None or not load.get("cores"):
        return False
    return load["other_cpu_cores_mean"] > BUSY_OTHER_CORES_FRAC * load["cores"]


def own_root() -> psutil.Process:
    """The process whose tree is the run: the launcher named by RUN_ROOT_ENV when it is an
    ancestor of this process, else the torchrun agent for a torchrun rank, else this process."""
    me = psutil.Process()
    try:
        launcher = int(os.environ.get(RUN_ROOT_ENV, ""))
        for parent in me.parents():
            if parent.pid == launcher:
                return parent
    except (ValueError, psutil.Error):
        pass
    if "TORCHELASTIC_RUN_ID" in os.environ:  # set by torchrun for every rank it starts
        parent = me.parent()
        if parent is not None:
            return parent
    return me


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return [root]


def _tree_cpu_s(root: psutil.Process) -> tuple[dict[int, float], int]:
    """CPU seconds (user + system) of every process in `root`'s tree by pid, and their threads."""
    cpu, threads = {}, 0
    for p in _tree(root):
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
    """`start()` once the warm-up is done, `stop()` after the last step: `result` is env.host_load."""

    def __init__(self) -> None:
        self.root = own_root()
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


class _OwnCpu:
    """CPU seconds the run's processes used since `start`, cheap enough to read every step: the
    tree is listed only when `relist` asks (psutil reads every process of the machine to find
    children), and each known process's counter is read on its own."""

    def __init__(self, root: psutil.Process) -> None:
        self.root = root
        self.procs: dict[int, psutil.Process] = {}
        self.last: dict[int, float] = {}
        self.total_s = 0.0
        self.listed_at = -math.inf
        self._read_at = _since_boot()  # when the counters were last read

    def relist(self) -> None:
        boot = psutil.boot_time()
        for p in _tree(self.root):
            if p.pid in self.procs:
                continue
            try:  # started since the last reading: all its CPU is the run's, from 0
                new = p.create_time() - boot >= self._read_at - START_TICK_S
                self.last[p.pid] = 0.0 if new else _cpu(p)
                self.procs[p.pid] = p
            except psutil.Error:
                continue
        self.listed_at = time.perf_counter()

    def read(self) -> float:
        """CPU seconds the known processes used since `start` (an ended one keeps its last count)."""
        for pid, p in list(self.procs.items()):
            try:
                now = _cpu(p)
            except psutil.Error:
                del self.procs[pid]
                continue
            self.total_s += now - self.last[pid]
            self.last[pid] = now
        self._read_at = _since_boot()
        return self.total_s


def _since_boot() -> float:
    """Seconds since boot now, on the clock of a process's start time: Linux counts that in
    ticks since boot (psutil's create_time adds the boot time, a whole second), so the boot
    clock compares exactly; elsewhere the wall clock."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.time() - psutil.boot_time()


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


class StepLoadMeter:
    """steps.csv `other_cpu_cores` (the module docstring): `start()` before the first step, then
    `sample()` at the end of every step returns the step's value."""

    def __init__(self, root: psutil.Process | None = None) -> None:
        self.own = _OwnCpu(root or own_root())
        self._samples: deque[tuple[float, float, float]] = deque()

    def _take(self) -> tuple[float, float, float]:
        own = self.own.read()
        busy = _system()[0]
        sample = (time.perf_counter(), busy, own)
        self._samples.append(sample)
        return sample

    def start(self) -> None:
        self.own.relist()
        self._samples.clear()
        self._take()

    def sample(self, *, relist: bool = False) -> float | None:
        """Cores' worth of CPU other processes used over the window ending now; None before
        `start`. `relist`: list the run's processes first (new DataLoader workers)."""
        if not self._samples:
            return None
        if relist or time.perf_counter() - self.own.listed_at > TREE_RELIST_S:
            self.own.relist()
        t, busy, own = self._take()
        # the newest earlier sample at least the window old (else the oldest) starts the window
        while len(self._samples) > 2 and self._samples[1][0] <= t - STEP_LOAD_WINDOW_S:
            self._samples.popleft()
        t0, busy0, own0 = self._samples[0]
        if t <= t0:
            return None
        return max(0.0, (busy - busy0 - (own - own0)) / (t - t0))
