"""Training loop callbacks: the fixed points a loop calls, and the torch-level instruments.

A loop (dpscope's own, workloads.train.loop; later a user's loop through a recorder) owns one
`StepState` and one `Callbacks` list, and calls `callbacks.fire(event, state)` at these points,
in this order (as Composer's `Callback` does):

- `run_start`: once, after the model and optimizer exist (and a resumed run has loaded its
  checkpoint), before the first step.
- `step_start`: at the start of every optimizer step, before its batch is fetched.
- `after_data`: the batch is on the device; the forward comes next.
- `after_forward`: after the forward of the step's last micro-batch, right before the backward
  that all-reduces under DDP (once per optimizer step, also with gradient accumulation).
- `after_backward`: every micro-batch's backward is done; gradients are ready and the optimizer
  step comes next.
- `step_end`: after the optimizer step. The `StepRecorder`, first in the list, stops the step's
  clock and appends `state.row`; the callbacks after it add their steps.csv columns to that row.
- `checkpoint`: before the loop writes a checkpoint (a collective under DDP).
- `epoch_end`: after an epoch's last step, before its evaluation.
- `eval_batch`: before each evaluation batch (progress inside a long evaluation).
- `run_end`: once, after the last step and evaluation, before the run record is written.

Between these points the loop times its phases with `callbacks.phase(state, name)` (data,
forward, backward, optimizer): every callback's `phase` context wraps the block, and
`state.phase` names it. Callbacks run in list order at every event.

This module imports torch only: a loop that is not dpscope's can use every callback here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from profiler.memory import MemoryTracker
from profiler.memory_breakdown import StaticMemory
from profiler.runfolder.hostload import HostLoadMeter, StepLoadMeter
from profiler.runfolder.layout import STEPS_COLUMNS
from profiler.session import ProfilerSession
from profiler.timers import StepTimer

__all__ = [
    "EVENTS",
    "Callback",
    "Callbacks",
    "HostLoadSampler",
    "MemorySampler",
    "ProfilerStep",
    "StaticMemoryCount",
    "StepRecorder",
    "StepState",
]

EVENTS = (
    "run_start",
    "step_start",
    "after_data",
    "after_forward",
    "after_backward",
    "step_end",
    "checkpoint",
    "epoch_end",
    "eval_batch",
    "run_end",
)
"""The callback points, in the order a loop reaches them (see the module docstring)."""


@dataclass(kw_only=True)
class StepState:
    """What a callback sees of the loop; the loop updates it before each event."""

    rank: int = 0
    """Global rank of this process (0 outside DDP)."""
    model: torch.nn.Module | None = None
    """The model as trained (wrapped by DataParallel/DDP where the mode does); None while a
    loop that finds it from hooks has not seen it yet."""
    optimizer: torch.optim.Optimizer | None = None
    """The optimizer the loop steps (None until known, as `model`)."""
    epoch: int = 0
    """Current epoch (0-based)."""
    step: int = 0
    """The optimizer step now running (0-based over the whole run); after a step, at
    `checkpoint`, `epoch_end` and `run_end`, the number of steps done."""
    first_step: int = 0
    """The first step this process runs (> 0 when it resumed from a checkpoint)."""
    phase: str | None = None
    """The phase the loop is timing (data, forward, backward, optimizer), else None."""
    samples: int = 0
    """Samples in this rank's share of the step's batch (set at `after_data`)."""
    loss: torch.Tensor | None = None
    """The step's loss tensor (set before `after_backward`; a callback may replace it)."""
    loss_value: float | None = None
    """The loss as a float, read once per step by the StepRecorder at `step_end`."""
    row: dict[str, Any] = field(default_factory=dict)
    """The step's steps.csv row, built at `step_end`."""


class Callback:
    """Base class: override the events you need; every method is a no-op here."""

    def run_start(self, state: StepState) -> None: ...
    def step_start(self, state: StepState) -> None: ...
    def after_data(self, state: StepState) -> None: ...
    def after_forward(self, state: StepState) -> None: ...
    def after_backward(self, state: StepState) -> None: ...
    def step_end(self, state: StepState) -> None: ...
    def checkpoint(self, state: StepState) -> None: ...
    def epoch_end(self, state: StepState) -> None: ...
    def eval_batch(self, state: StepState) -> None: ...
    def run_end(self, state: StepState) -> None: ...

    def phase(self, state: StepState, name: str) -> AbstractContextManager[None]:
        """A context around the loop's phase `name` (state.phase is already set)."""
        return nullcontext()


class Callbacks:
    """The callbacks of one loop, called in list order."""

    def __init__(self, callbacks: Iterable[Callback]) -> None:
        self.callbacks = list(callbacks)

    def fire(self, event: str, state: StepState) -> None:
        """Call every callback's `event` method with `state`."""
        if event not in EVENTS:
            raise ValueError(f"unknown callback event {event!r}; use one of {', '.join(EVENTS)}")
        for cb in self.callbacks:
            getattr(cb, event)(state)

    @contextmanager
    def phase(self, state: StepState, name: str) -> Iterator[None]:
        """Run the enclosed block as phase `name` inside every callback's `phase` context."""
        state.phase = name
        try:
            with ExitStack() as stack:
                for cb in self.callbacks:
                    stack.enter_context(cb.phase(state, name))
                yield
        finally:
            state.phase = None


class StepRecorder(Callback):
    """The one writer of steps.csv rows: times each step's phases (profiler.timers) and keeps
    this rank's rows.

    At `step_end` it stops the clock, reads the loss once and appends a row with every column of
    STEPS_COLUMNS; the later callbacks fill their own in the same dict (`profiled` and
    `profiler_s` are 0 until ProfilerStep sets them, `rss_bytes` and `cuda_allocated_bytes` None until MemorySampler does).
    `warmup` is 1 for the run's first `warmup_steps` steps.
    """

    def __init__(self, timer: StepTimer, *, warmup_steps: int) -> None:
        self.timer = timer
        self.warmup_steps = warmup_steps
        self.rows: list[dict[str, Any]] = []
        """This rank's rows; a checkpoint may take (and clear) them."""
        self.ended_at: float | None = None
        """time.perf_counter() when the last step's clock stopped."""

    def step_start(self, state: StepState) -> None:
        self.timer.start_step()

    def phase(self, state: StepState, name: str) -> AbstractContextManager[None]:
        return self.timer.phase(name)

    def step_end(self, state: StepState) -> None:
        times = self.timer.end_step()  # first: what follows stays outside step_time_s
        self.ended_at = time.perf_counter()
        state.loss_value = None if state.loss is None else float(state.loss.item())
        state.row = dict.fromkeys(STEPS_COLUMNS)
        state.row.update(
            rank=state.rank,
            epoch=state.epoch,
            step=state.step,
            warmup=int(state.step < self.warmup_steps),
            profiled=0,
            profiler_s=0.0,
            **times,
            samples=state.samples,
            loss=state.loss_value,
        )
        self.rows.append(state.row)


class StaticMemoryCount(Callback):
    """Counts the static memory breakdown (profiler.memory_breakdown) between backward and the
    optimizer step, and after the optimizer step (before the profiler moves its schedule on);
    FSDP's unsharded peak is sampled from the counted step's start."""

    def __init__(self, static: StaticMemory) -> None:
        self.static = static

    def step_start(self, state: StepState) -> None:
        self.static.before_step(state.model, state.step)

    def after_backward(self, state: StepState) -> None:
        if state.model is not None:
            self.static.after_backward(state.model, state.step)

    def step_end(self, state: StepState) -> None:
        if state.model is not None and state.optimizer is not None:
            self.static.after_optimizer(state.model, state.optimizer, state.step)


class ProfilerStep(Callback):
    """Drives the profiler session's schedule: started at `run_start` at the loop's step (a
    resumed run continues its schedule), stepped at every `step_end`, stopped at `run_end`.

    Sets the row's `profiled` (1 when the step was traced, warm-up or active) and keeps the
    steps the profiler recorded in `active_steps` (profiler_overhead_pct).

    The profiler's own work at a step's end (preparing, starting or stopping its trace, and
    exporting it at the end of an active window) happens inside the step from the training
    script's point of view (in `optimizer.step()` under `--script`), so its seconds are the
    row's `profiler_s` and are added to its `step_time_s` (in no phase): a step's time matches
    a timer around the script's iteration. `exports` lists each call that wrote a trace,
    `{step, export_s}`; the export of a cycle cut short by the end of the run (at `run_end`)
    has `step` None: it falls in no step."""

    def __init__(self, session: ProfilerSession) -> None:
        self.session = session
        self.active_steps: list[int] = []
        self.exports: list[dict[str, Any]] = []

    def run_start(self, state: StepState) -> None:
        self.session.start(step=state.step)

    def _timed(self, call: Callable[[], None], step: int | None) -> float:
        """Seconds `call` took; an export when it wrote a trace."""
        written = len(self.session.trace_files())
        start = time.perf_counter()
        call()
        spent = time.perf_counter() - start
        if len(self.session.trace_files()) > written:
            self.exports.append({"step": step, "export_s": spent})
        return spent

    def step_end(self, state: StepState) -> None:
        phase = self.session.phase()  # of this step, asked before step() moves the schedule on
        if phase == "active":
            self.active_steps.append(state.step)
        state.row["profiled"] = int(phase != "none")
        if not self.session.running:
            state.row["profiler_s"] = 0.0
            return
        spent = self._timed(self.session.step, state.step)
        state.row["profiler_s"] = spent
        state.row["step_time_s"] += spent

    def run_end(self, state: StepState) -> None:
        if self.session.running:
            self._timed(self.session.stop, None)

    @property
    def export_s(self) -> float:
        """Seconds spent exporting traces, in steps or not."""
        return sum(e["export_s"] for e in self.exports)


class MemorySampler(Callback):
    """Samples memory (profiler.memory) from `run_start` to `run_end`: the row's `rss_bytes` and
    `cuda_allocated_bytes` at every `step_end`, and the first-step window after the first step
    this process runs."""

    def __init__(self, tracker: MemoryTracker) -> None:
        self.tracker = tracker

    def run_start(self, state: StepState) -> None:
        self.tracker.start()

    def step_end(self, state: StepState) -> None:
        state.row.update(self.tracker.step_sample())
        if state.step == state.first_step:
            self.tracker.mark_first_step()

    def run_end(self, state: StepState) -> None:
        self.tracker.stop()


class HostLoadSampler(Callback):
    """Measures how busy the machine is (profiler.runfolder.hostload), on rank 0 only (one host):
    the row's `other_cpu_cores` at every `step_end` (StepLoadMeter, from `run_start`), and
    env.host_load (`result`) from the end of the warm-up to `run_end`; other ranks' cells stay
    empty and their `result` None, as it is when every step was a warm-up step.

    The run-level meter starts after the last warm-up step's row, not inside the first measured
    step, whose time it would otherwise add to (it lists the run's processes)."""

    def __init__(self, *, warmup_steps: int, enabled: bool) -> None:
        self.warmup_steps = warmup_steps
        self.meter = HostLoadMeter() if enabled else None
        self.steps = StepLoadMeter(self.meter.root) if self.meter is not None else None
        self._started = False
        self._epoch: int | None = None

    def _start_run_meter(self) -> None:
        if self.meter is not None and not self._started:
            self.meter.start()
            self._started = True

    def run_start(self, state: StepState) -> None:
        if self.steps is not None:
            self.steps.start()
            self._epoch = None  # the first step starts the DataLoader's workers: list them then
        if state.step >= self.warmup_steps:  # no warm-up left (none asked, or a resumed run)
            self._start_run_meter()

    def step_end(self, state: StepState) -> None:
        if self.steps is not None:
            # A new epoch (and the first step) started DataLoader workers: list the run's
            # processes again, so that their CPU is the run's, from their start.
            new_epoch = state.epoch != self._epoch
            self._epoch = state.epoch
            state.row["other_cpu_cores"] = self.steps.sample(relist=new_epoch)
        if state.step + 1 >= self.warmup_steps:  # the next step is a measured one
            self._start_run_meter()

    def run_end(self, state: StepState) -> None:
        if self.meter is not None:
            self.meter.stop()

    @property
    def result(self) -> dict | None:
        return self.meter.result if self.meter is not None else None
