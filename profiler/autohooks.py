"""Zero-code instrumentation: torch's global hooks drive a RunRecorder (profiler.recorder), so an
unedited training script gets the standard run folder (docs/guides/own-script.md).

- **Step** = one optimizer step: from the end of the previous step (the first step: from the
  first training forward) to `optimizer.step()`'s global post-hook
  (`register_optimizer_step_post_hook`). Gradient accumulation needs nothing more: a step is
  however many forwards and backwards precede one optimizer step. Only the first optimizer seen
  stepping counts; another optimizer's step falls inside the step (in its backward phase).
- **Training forward** = an outermost module call with gradients enabled, of a module that has
  parameters: a loss module (no parameters) and an evaluation under `torch.no_grad()` are timed
  in whatever phase is open and add no samples. The model is the first such module, or the
  DDP / DataParallel wrapper once one is called.
- **Phases** (disjoint, covering the step):
  - forward = the outermost module call (global forward hooks; a module called inside another
    one's forward is not outermost, so a DDP or DataParallel wrapper counts as the model);
  - backward = from the end of that forward to the next training forward or the optimizer's
    pre-hook (loss, backward, gradient clipping; with accumulation also the next micro-batch's
    fetch);
  - optimizer = the optimizer's pre-hook to its post-hook;
  - data = the rest: from the step's start to its first forward (loading, `zero_grad` at the
    loop's end, logging).
- **Samples** = the leading dimension of the first tensor given to each forward of the model
  (positional inputs, then keyword inputs; dicts, tuples and lists searched in order), summed
  over the step's forwards; `samples_per_step` overrides it.
- **Mode**: `fsdp` when the model was fully_shard-ed (FSDP2, any world size), `ddp` when the
  outermost module is a DistributedDataParallel, `dp` for DataParallel, else `single` (a process
  group of several ranks around a plain module also records `ddp`).
- A script that starts its own `torch.profiler` keeps it: dpscope's session stops and run.json's
  `warnings` say so.
- **`max_steps`** (`--max-steps N`): the post-hook of the N-th step raises `MaxStepsReached`
  (a BaseException, so the script's `except Exception` lets it through) out of the script's
  `optimizer.step()`; every rank stops at the same step, after its collectives.
- `guard` (a context manager factory) wraps the hooks' own bookkeeping: the bootstrap holds
  SIGINT/SIGTERM there, so a signal never cuts a step's record in half.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from profiler.recorder import RunRecorder, first_tensor

__all__ = ["AutoSteps", "HookedRecorder", "MaxStepsReached"]


class MaxStepsReached(BaseException):
    """The run reached `--max-steps`: raised out of the script's N-th `optimizer.step()`."""


class HookedRecorder(RunRecorder):
    """The RunRecorder of a `--script` rank: its part adds how the script ended (`ending`, set
    by the bootstrap before `close`) and the profiler's exports (`profile_exports`)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.ending: dict = {}

    def part(self) -> dict:
        exports = self.rec.profiler.exports if self.rec is not None else []
        return {**super().part(), "profile_exports": exports, **self.ending}


class AutoSteps:
    """Global hooks that mark steps and phases on `recorder` (see the module docstring)."""

    def __init__(
        self,
        recorder: RunRecorder,
        *,
        samples_per_step: int | None = None,
        max_steps: int = 0,
        guard: Callable[[], AbstractContextManager[None]] = nullcontext,
    ) -> None:
        self.rec = recorder
        self.samples_per_step = samples_per_step
        self.max_steps = max_steps
        self.guard = guard
        self.setup_s = 0.0  # dpscope's set-up inside the step now running (charged at its end)
        self.depth = 0
        self.outermost: nn.Module | None = None  # the training forward now running
        self.optimizer: torch.optim.Optimizer | None = None
        self.handles: list = []

    def install(self) -> None:
        """Register the hooks (for the rest of the process) and watch torch.profiler."""
        self.handles = [
            register_module_forward_pre_hook(self._pre_forward),
            register_module_forward_hook(self._post_forward, with_kwargs=True, always_call=True),
            register_optimizer_step_pre_hook(self._pre_step),
            register_optimizer_step_post_hook(self._post_step),
        ]
        _watch_user_profiler(self.rec)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def _pre_forward(self, module: nn.Module, args: tuple) -> None:
        self.depth += 1
        if self.depth > 1 or not torch.is_grad_enabled() or not _has_parameters(module):
            return  # inner calls, evaluation, and loss modules (time of the phase that is open)
        rec = self.rec
        if rec.in_step and rec._phase is not None and rec._phase[0] == "optimizer":
            return  # a closure's forward inside optimizer.step() (LBFGS) is optimizer time
        if isinstance(module, nn.parallel.DistributedDataParallel | nn.DataParallel):
            rec.state.model = module
            rec.mode = "dp" if isinstance(module, nn.DataParallel) else "ddp"
        elif rec.state.model is None:
            rec.state.model = module
        self.outermost = module
        if not rec.in_step:
            rec.input_device = rec.input_device or _device(first_tensor(args))
            self._begin_step()
        rec.open_phase("forward")

    def _post_forward(self, module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        self.depth = max(0, self.depth - 1)
        if self.depth or self.outermost is not module:
            return
        self.outermost = None
        if module is self.rec.state.model:  # a second model's forward (a teacher) adds none
            tensor = first_tensor(args)
            self.rec.add_forward(tensor if tensor is not None else first_tensor(kwargs))
        self.rec.open_phase("backward")

    def _pre_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self.optimizer is None:
            self.optimizer = optimizer
            self.rec.state.optimizer = optimizer
        if optimizer is not self.optimizer:
            return
        if not self.rec.in_step:  # a step with no training forward seen (a functional model)
            self._begin_step()
        self.rec.open_phase("optimizer")

    def _post_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if optimizer is not self.optimizer or not self.rec.in_step:
            return
        with self.guard():
            self.rec.end_step(self.samples_per_step)
            if self.max_steps and len(self.rec.micro_batches) >= self.max_steps:
                self._charge_tail()
                raise MaxStepsReached(self.max_steps)
            self.rec.begin_step()
            self._charge_tail()
            if self.rec.rec is not None:
                self.rec.rec.recorder.timer.start_step()  # the next step starts now
            self.rec.open_phase("data")

    def _begin_step(self) -> None:
        """A step begun by a hook (the first, or one after the script's own pause): dpscope's
        set-up there (its instruments, at the first step) runs inside the script's iteration,
        so it is charged to that step (`_charge_tail`)."""
        start = time.perf_counter()
        self.rec.begin_step()
        self.setup_s = time.perf_counter() - start

    def _charge_tail(self) -> None:
        """dpscope's own work after a step's clock stopped (memory sampling, the next step's
        set-up; the profiler's work is already in `profiler_s`) runs inside the script's
        `optimizer.step()`: it is added to that step's `step_time_s`, in no phase."""
        recording = self.rec.rec
        if recording is None or not recording.recorder.rows or recording.recorder.ended_at is None:
            return
        row = recording.recorder.rows[-1]
        tail = time.perf_counter() - recording.recorder.ended_at - (row.get("profiler_s") or 0.0)
        row["step_time_s"] += max(0.0, tail) + self.setup_s
        self.setup_s = 0.0


def _has_parameters(module: nn.Module) -> bool:
    """A module with parameters: what trains (a loss module has none)."""
    return next(module.parameters(), None) is not None


def _device(tensor: torch.Tensor | None) -> torch.device | None:
    return None if tensor is None else tensor.device


def _watch_user_profiler(rec: RunRecorder) -> None:
    """Wrap torch.profiler.profile.start: a profiler that is not dpscope's own stops dpscope's
    (two Kineto sessions cannot run at once, and the script's must keep working)."""
    original = torch.profiler.profile.start
    if getattr(original, "_dpscope", False):
        return

    @functools.wraps(original)
    def start(self: torch.profiler.profile) -> None:
        ours = rec.rec is not None and rec.rec.profiler.session._prof is self
        if not ours:
            rec.profiler_taken()
        return original(self)

    start._dpscope = True  # type: ignore[attr-defined]
    torch.profiler.profile.start = start  # type: ignore[method-assign]
