"""The profiler session: a thin, schedule-driven wrapper around `torch.profiler.profile`.

The training loop drives it with `start()`, `step()` once per optimizer step, and `stop()` (or
uses it as a context manager). Traces are standard Kineto JSON exported by torch, named from
one template, `<worker>.<time_ns>.pt.trace.json.gz` (profiler.runfolder.layout.TRACE_NAME): the name the TensorBoard
profiler plugin needs to find the file and to take the worker from it. torch adds
`distributedInfo` (backend, rank, world_size) to the trace when a process group is initialised.

With `enabled=False` every method is a no-op, so `--no-profile` runs measure the profiler's
overhead against otherwise identical runs. The multi-host test hook DPSCOPE_CLOCK_SHIFT
(profiler.clockshift) is read once, here, and applied to each trace before it gets its name.

A trace is exported under a name no reader lists (`.<name>.partial`) and renamed to its real
name only once complete, so a full disk never leaves a truncated `.pt.trace.json.gz` behind: the
partial file is removed and the export fails with one DiskError line naming the trace.

torch.profiler (Kineto) allows one session per process: a second one crashes the process. So
one ProfilerSession runs at a time per process (`start` of another raises ProfilerBusy), and
`active()` says which, so a RunRecorder can refuse to start inside dpscope's own loop.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType

import msgspec
from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

from profiler.clockexchange import probe_clock
from profiler.clockshift import apply_clock_shift, clock_shift_us
from profiler.runfolder.clockprobe import CLOCK_PROBE_KEY, ClockProbe
from profiler.runfolder.errors import disk_writes
from profiler.runfolder.layout import TRACE_GLOB, TRACE_NAME, trace_name
from profiler.runfolder.schema import ProfileSettings

__all__ = ["TRACE_GLOB", "TRACE_NAME", "ProfileConfig", "ProfilerBusy", "ProfilerSession", "active"]

_ACTIVE: list[ProfilerSession] = []  # the one running session of this process (at most one)


class ProfilerBusy(RuntimeError):
    """A second profiler session in a process that already runs one."""


def active() -> ProfilerSession | None:
    """The ProfilerSession running in this process, if any."""
    return _ACTIVE[0] if _ACTIVE else None


@dataclass(kw_only=True)
class ProfileConfig:
    """When and what torch.profiler records (run.json `config.profile`)."""

    enabled: bool = True
    """False turns the profiler off entirely (overhead comparisons, `--no-profile`)."""
    wait: int = 1
    """Steps skipped at the start of each cycle (>= 0)."""
    warmup: int = 1
    """Steps traced but discarded, so tracing start-up cost stays out of the trace (>= 0)."""
    active: int = 3
    """Steps recorded into one trace file per cycle (>= 1)."""
    repeat: int = 1
    """Number of wait/warmup/active cycles; 0 repeats until the run ends (one trace per cycle)."""
    record_shapes: bool = True
    """Record operator input shapes (collectives then carry their tensor dims)."""
    profile_memory: bool = True
    """Record tensor allocations and frees."""
    with_stack: bool = False
    """Record Python stacks; off by default because it multiplies the trace size."""

    def __post_init__(self) -> None:
        # Named by their command-line flags: TrainConfig checks its settings through this class.
        for name in ("wait", "warmup", "repeat"):
            if getattr(self, name) < 0:
                raise ValueError(f"--profile-{name} must be >= 0; got {getattr(self, name)}")
        if self.active < 1:
            raise ValueError(
                f"--profile-active must be >= 1; got {self.active} (use --no-profile to turn "
                "profiling off)"
            )

    def to_dict(self) -> dict:
        """The settings as keyword arguments (what a `--script` rank is handed)."""
        return asdict(self)

    def settings(self) -> ProfileSettings:
        """The run record's `config.profile`."""
        return ProfileSettings(**asdict(self))

    def schedule(self) -> Callable[[int], ProfilerAction]:
        """torch's own `torch.profiler.schedule` for this config: the session drives the profiler
        with it, and `phase` asks it, so steps.csv's `profiled` column cannot drift from what the
        profiler actually recorded."""
        return schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=self.repeat)

    def phase(self, step: int) -> str:
        """What the profiler does in its `step`-th step (0-based, counted from `start()`):
        `none` (not traced: a wait step or after the last cycle), `warmup` (traced, discarded)
        or `active` (recorded into a trace). Always `none` when disabled."""
        if not self.enabled:
            return "none"
        with warnings.catch_warnings():  # torch's "won't be using warmup" note: start() says it
            warnings.simplefilter("ignore", UserWarning)
            action = self.schedule()(step)
        if action == ProfilerAction.NONE:
            return "none"
        return "warmup" if action == ProfilerAction.WARMUP else "active"


class ProfilerSession:
    """Wraps `torch.profiler.profile`; a no-op when `cfg.enabled` is False.

    `worker_name` is `rank<r>` for single-device and DDP runs and `dp` for DataParallel (one
    process); it becomes the worker name in TensorBoard and the prefix of each trace file.
    """

    def __init__(
        self, cfg: ProfileConfig, *, trace_dir: Path, worker_name: str, use_cuda: bool
    ) -> None:
        if not worker_name or "." in worker_name:
            # The plugin splits the file name at the first '.', so a dot would corrupt the worker.
            raise ValueError(f"worker_name must be non-empty and without '.', got {worker_name!r}")
        self.cfg = cfg
        self.trace_dir = Path(trace_dir)
        self.worker_name = worker_name
        self.use_cuda = use_cuda
        self._written: list[Path] = []
        self._prof: profile | None = None
        self._running = False
        self._steps = 0  # prof.step() calls since start(): the schedule's step number
        self._rank = int(os.environ.get("RANK", "0") or 0)
        self._clock_shift_us = clock_shift_us(self._rank)  # the test hook, read once
        self._probe: ClockProbe | None = None  # measured, not yet in the trace

    def _on_trace_ready(self, prof: profile) -> None:
        # What torch's tensorboard_trace_handler does, with the name taken from our template so
        # the session knows the file it wrote without looking at the folder.
        path = self.trace_dir / trace_name(self.worker_name, time.time_ns())
        partial = path.with_name(f".{path.name}.partial.gz")  # no reader lists it (module doc)
        try:
            with disk_writes(path):
                prof.export_chrome_trace(str(partial))  # gzipped because the name ends in .gz
                if self._clock_shift_us is not None:
                    apply_clock_shift(partial, self._clock_shift_us, self._rank)
                os.replace(partial, path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        self._written.append(path)

    def start(self, *, step: int = 0) -> None:
        """Begin the schedule at optimizer step `step` (0 = the first `wait` step; a resumed run
        passes the step it resumed from, so the schedule and the `ProfilerStep#` numbers follow
        the run's global steps). Idempotent."""
        if not self.cfg.enabled or self._running:
            return
        if (other := active()) is not None:
            raise ProfilerBusy(
                f"a dpscope profiler session ({other.worker_name}, traces in {other.trace_dir}) "
                "is already running in this process; torch.profiler allows one per process"
            )
        activities = [ProfilerActivity.CPU]
        if self.use_cuda:
            activities.append(ProfilerActivity.CUDA)
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        self._prof = profile(
            activities=activities,
            schedule=self.cfg.schedule(),
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.cfg.record_shapes,
            profile_memory=self.cfg.profile_memory,
            with_stack=self.cfg.with_stack,
        )
        if step:
            # Public attributes of torch.profiler.profile: the schedule is consulted at
            # `step_num`, and start() labels the first step with it.
            self._prof.step_num = step
            self._prof.current_action = self._prof.schedule(step)
            if hasattr(self._prof, "_prev_schedule_action"):
                self._prof._prev_schedule_action = self._prof.current_action
        if self._prof.schedule(self._prof.step_num) != ProfilerAction.NONE:
            self._probe_clock()
        self._prof.start()
        self._attach_probe()
        self._steps = 0
        self._running = True
        _ACTIVE.append(self)

    @property
    def running(self) -> bool:
        """Whether the session is between `start()` and `stop()` (False when disabled)."""
        return self._running

    def phase(self) -> str:
        """The schedule's phase (`none` | `warmup` | `active`) of the step now running, i.e. the
        one the next `step()` call ends; `none` when the session is not running."""
        return self.cfg.phase(self._steps) if self._running else "none"

    def step(self) -> None:
        """Advance the schedule; call once at the end of every optimizer step."""
        if self._running:
            assert self._prof is not None
            idle = self._prof.current_action == ProfilerAction.NONE
            if idle and self._prof.schedule(self._prof.step_num + 1) != ProfilerAction.NONE:
                self._probe_clock()  # the next step begins a traced window
            self._prof.step()
            self._attach_probe()
            self._steps += 1

    def _probe_clock(self) -> None:
        """Measure this rank's clock against rank 0's while the profiler is idle, so the
        exchange is in no trace (profiler.clockexchange); every rank calls it at the same step.
        With `wait` 0 and several cycles, a cycle after the first starts while the previous one
        records: it gets no probe, and the analysis uses its collectives alone."""
        assert self._prof is not None
        self._probe = probe_clock(str(self._prof.step_num))

    def _attach_probe(self) -> None:
        """Put the measured probe into the trace being recorded (a top-level key of its JSON)."""
        if self._probe is not None and self._prof is not None:
            if self._prof.current_action != ProfilerAction.NONE:
                self._prof.add_metadata_json(
                    CLOCK_PROBE_KEY, msgspec.json.encode(self._probe).decode()
                )
                self._probe = None

    def stop(self) -> None:
        """Stop profiling; a cycle cut short by the end of the run is still written. Idempotent."""
        if self._running:
            assert self._prof is not None
            self._running = False
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            self._prof.stop()

    def __enter__(self) -> ProfilerSession:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def trace_files(self) -> list[Path]:
        """Trace files this session has written so far, oldest first."""
        return list(self._written)
