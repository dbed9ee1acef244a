"""Per-step phase timers for every optimizer step (steps.csv), not only the profiled ones.

A step is split into the phases `data` (waiting for and moving the batch), `forward`, `backward`
and `optimizer`. Each phase is also a `torch.profiler.record_function` range of the same name,
so the traces carry the same phases as steps.csv.

On a CUDA device the phase boundaries are CUDA events on the current stream, and the host
synchronises only once per step (in `end_step`): timing must not serialise the work it measures.
On CPU the boundaries are `time.perf_counter()` readings.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from profiler.runfolder.layout import STEP_PHASES

__all__ = ["StepTimer"]


class StepTimer:
    """Times the phases of one optimizer step at a time.

    `end_step()` returns seconds: `step_time_s` (from `start_step` to `end_step`) and `<phase>_s`
    for each of `STEP_PHASES` (the sum of that phase's ranges in the step, 0.0 if it did not occur).
    The phases are disjoint, so their sum is at most `step_time_s`; the rest is loop overhead.
    """

    def __init__(self, *, device: torch.device) -> None:
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._step_start: object | None = None
        self._spans: list[tuple[str, object, object]] = []
        self._open: str | None = None

    def _mark(self) -> object:
        """A point in time: a recorded CUDA event on CUDA, a perf_counter reading elsewhere."""
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def start_step(self) -> None:
        """Begin a step; discards any phases of an unfinished previous step."""
        self._spans = []
        self._step_start = self._mark()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the enclosed block as phase `name` and mark it as a profiler range of that name."""
        if name not in STEP_PHASES:
            raise ValueError(f"unknown phase {name!r}; use one of {', '.join(STEP_PHASES)}")
        if self._step_start is None:
            raise RuntimeError("StepTimer.phase() called outside a step; call start_step() first")
        if self._open is not None:
            raise RuntimeError(
                f"phase {name!r} opened inside phase {self._open!r}; phases are flat"
            )
        self._open = name
        try:
            with torch.profiler.record_function(name):
                start = self._mark()
                try:
                    yield
                finally:
                    self._spans.append((name, start, self._mark()))
        finally:
            self._open = None

    def end_step(self) -> dict[str, float]:
        """Finish the step and return `{"step_time_s", "data_s", "forward_s", ...}` in seconds."""
        if self._step_start is None:
            raise RuntimeError("StepTimer.end_step() called without start_step()")
        end = self._mark()
        if self._cuda:
            # The single host sync of the step: every earlier event on the stream is done too.
            end.synchronize()

            def seconds(a: object, b: object) -> float:
                return a.elapsed_time(b) / 1e3  # elapsed_time is in milliseconds

        else:

            def seconds(a: object, b: object) -> float:
                return b - a

        result = {"step_time_s": seconds(self._step_start, end)}
        result.update({f"{p}_s": 0.0 for p in STEP_PHASES})
        for name, a, b in self._spans:
            result[f"{name}_s"] += seconds(a, b)
        self._step_start = None
        self._spans = []
        return result
