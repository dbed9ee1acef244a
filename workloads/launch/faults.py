"""Fault injection test hooks, the non-finite-loss stop, and how a rank's exception is classified.

Test hooks (environment variables, read ONCE when training starts; they act only in the first
attempt of a job, so a restarted job runs clean):

- `DPSCOPE_KILL_RANK` / `DPSCOPE_KILL_STEP`: that rank sends itself SIGKILL before the forward
  of that optimizer step (as the OOM killer would).
- `DPSCOPE_HANG_RANK` / `DPSCOPE_HANG_STEP`: that rank sleeps forever before its backward, so
  the other ranks wait in the gradient allreduce.
- `DPSCOPE_NAN_STEP`: every rank's loss becomes NaN at that step (a divergence).
- `DPSCOPE_START_DELAY_S`: every rank sleeps that many seconds at the run's start, after the
  model and data are built and before the first step (a slow set-up, which the launcher's
  watchdog must not call a hang).
- `DPSCOPE_FAIL_RANK` / `DPSCOPE_FAIL_STEP` (default 0): that rank raises a RuntimeError at that
  optimizer step, in every attempt (the launcher's failed-rank record is tested with it).

`FaultInjection` applies the hooks and the non-finite-loss stop at the training loop's callback
points (profiler.callbacks). `classify` maps the exception a rank died of to run.json's `error.kind` and its details.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch

from profiler.callbacks import Callback, StepState
from profiler.runfolder.atomic import write_json_atomic
from profiler.runfolder.errors import DiskError, disk_error
from profiler.runfolder.layout import TRACE_GLOB, TRACES_DIR
from profiler.runfolder.schema import Resume
from workloads.config import TrainConfig
from workloads.plan import Environment, plan, torchrun_layout

__all__ = [
    "FaultHooks",
    "FaultInjection",
    "NonFiniteLoss",
    "attempt",
    "check_loss",
    "all_traces",
    "classify",
    "error_details",
    "injected_failure_step",
    "raise_injected_failure",
    "per_device_batch",
    "read_attempts",
    "signal_name",
    "timed_out",
    "write_attempt",
]

KILL_RANK_ENV, KILL_STEP_ENV = "DPSCOPE_KILL_RANK", "DPSCOPE_KILL_STEP"
HANG_RANK_ENV, HANG_STEP_ENV = "DPSCOPE_HANG_RANK", "DPSCOPE_HANG_STEP"
NAN_STEP_ENV = "DPSCOPE_NAN_STEP"
START_DELAY_ENV = "DPSCOPE_START_DELAY_S"
FAIL_RANK_ENV, FAIL_STEP_ENV = "DPSCOPE_FAIL_RANK", "DPSCOPE_FAIL_STEP"
# Phrases of the gloo/NCCL/store errors a rank raises when a collective or the store times out.
_TIMEOUT_WORDS = ("timed out", "timeout", "watchdog caught collective operation")


def attempt(env: Mapping[str, str] = os.environ) -> int:
    """This job attempt's number: torchrun's restart count (0 for the first attempt and outside
    torchrun)."""
    return int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def _number(env: Mapping[str, str], name: str, kind: type = int) -> int | float | None:
    """The hook's value as `kind` (None when unset); a ValueError naming it otherwise."""
    raw = env.get(name, "")
    if raw == "":
        return None
    try:
        return kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"{name} must be {what}; got {raw!r}") from None


@dataclass(frozen=True, kw_only=True)
class FaultHooks:
    """The test hooks as read once at start; all None when unset or after a restart."""

    kill_rank: int | None = None
    kill_step: int | None = None
    hang_rank: int | None = None
    hang_step: int | None = None
    nan_step: int | None = None
    start_delay_s: float = 0.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> FaultHooks:
        if attempt(env) > 0:
            return cls()  # a restarted job must not fail the same way again
        return cls(
            kill_rank=_number(env, KILL_RANK_ENV),
            kill_step=_number(env, KILL_STEP_ENV),
            hang_rank=_number(env, HANG_RANK_ENV),
            hang_step=_number(env, HANG_STEP_ENV),
            nan_step=_number(env, NAN_STEP_ENV),
            start_delay_s=_number(env, START_DELAY_ENV, float) or 0.0,
        )

    def at_start(self, rank: int) -> None:
        if self.start_delay_s > 0:
            print(
                f"[rank{rank}] {START_DELAY_ENV} test hook: sleeping {self.start_delay_s} s",
                flush=True,
            )
            time.sleep(self.start_delay_s)

    def before_forward(self, rank: int, step: int) -> None:
        if self.kill_rank == rank and self.kill_step == step:
            print(f"[rank{rank}] {KILL_RANK_ENV} test hook: SIGKILL at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def before_backward(self, rank: int, step: int) -> None:
        if self.hang_rank == rank and self.hang_step == step:
            print(f"[rank{rank}] {HANG_RANK_ENV} test hook: hanging at step {step}", flush=True)
            while True:
                time.sleep(3600)

    def poison(self, loss: torch.Tensor, step: int) -> torch.Tensor:
        return loss * float("nan") if self.nan_step == step else loss


def injected_failure_step(rank: int, env: Mapping[str, str] = os.environ) -> int | None:
    """The step at which the DPSCOPE_FAIL_RANK hook makes this rank fail (None: never); read once,
    at start. Unlike FaultHooks it is not reset by a restart."""
    if env.get(FAIL_RANK_ENV) != str(rank):
        return None
    return int(env.get(FAIL_STEP_ENV, "0"))


def raise_injected_failure(rank: int, step: int) -> NoReturn:
    raise RuntimeError(
        f"injected failure on rank {rank} at step {step} ({FAIL_RANK_ENV} test hook)"
    )


class NonFiniteLoss(FloatingPointError):
    """The loss became NaN or infinite (`--stop-on-nonfinite`)."""

    def __init__(self, *, rank: int, step: int, value: float) -> None:
        self.rank, self.step, self.value = rank, step, value
        super().__init__(
            f"loss is {value} at step {step} on rank {rank}; lower --lr, check the data, or pass "
            "--no-stop-on-nonfinite to keep training"
        )


def check_loss(value: float, *, rank: int, step: int, stop: bool) -> None:
    """Raise NonFiniteLoss when `stop` and the step's loss is not finite."""
    if stop and not math.isfinite(value):
        raise NonFiniteLoss(rank=rank, step=step, value=value)


class FaultInjection(Callback):
    """The test hooks and `--stop-on-nonfinite` at the loop's callback points: the start-up delay
    (`run_start`), the injected failure and the kill before the forward (`after_data`), the hang
    before the backward that all-reduces (`after_forward`), the NaN loss after the backward
    (`after_backward`) and the non-finite-loss check once the step's loss is read (`step_end`)."""

    def __init__(self, hooks: FaultHooks, *, rank: int, fail_at: int | None, stop: bool) -> None:
        self.hooks, self.rank, self.fail_at, self.stop = hooks, rank, fail_at, stop

    @classmethod
    def from_env(cls, *, rank: int, stop: bool) -> FaultInjection:
        """The hooks as the environment sets them, read once."""
        return cls(FaultHooks.from_env(), rank=rank, fail_at=injected_failure_step(rank), stop=stop)

    def run_start(self, state: StepState) -> None:
        self.hooks.at_start(self.rank)

    def after_data(self, state: StepState) -> None:
        if state.step == self.fail_at:
            raise_injected_failure(self.rank, state.step)
        self.hooks.before_forward(self.rank, state.step)

    def after_forward(self, state: StepState) -> None:
        self.hooks.before_backward(self.rank, state.step)

    def after_backward(self, state: StepState) -> None:
        if state.loss is not None:
            state.loss = self.hooks.poison(state.loss, state.step)

    def step_end(self, state: StepState) -> None:
        if state.loss_value is not None:
            check_loss(state.loss_value, rank=self.rank, step=state.step, stop=self.stop)


def signal_name(code: int) -> str:
    """'SIGKILL' for -9 (a negative exit code is the signal that ended the process)."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def classify(exc: BaseException, *, per_device_batch: int | None) -> dict:
    """run.json `error` fields for the exception a rank died of: {kind, message, ...}.

    kind is `oom` (torch.OutOfMemoryError), `diverged` (NonFiniteLoss), `hang` (a collective or
    store timeout; the launcher names the stuck rank from the heartbeats), `interrupted`
    (KeyboardInterrupt), `disk` (a write the disk refused: full, read-only, no permission; one
    line naming the path, profiler.runfolder.errors.DiskError) or `crash` (anything else).
    """
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, torch.OutOfMemoryError):
        return {
            "kind": "oom",
            "message": f"out of memory at per-device batch {per_device_batch}: lower --batch-size "
            f"or keep the global batch with gradient accumulation (--grad-accum-steps K) ({text.splitlines()[0]})",
            "per_device_batch": per_device_batch,
        }
    if isinstance(exc, NonFiniteLoss):
        return {"kind": "diverged", "message": str(exc), "step": exc.step, "value": str(exc.value)}
    if isinstance(exc, KeyboardInterrupt):
        return {"kind": "interrupted", "message": "interrupted (SIGINT)"}
    disk = disk_error(exc) if isinstance(exc, OSError | DiskError) else None
    if disk is not None or "no space left on device" in str(exc).lower():
        return {"kind": "disk", "message": str(disk) if disk is not None else text}
    if timed_out(str(exc)):
        return {"kind": "hang", "message": text}
    return {"kind": "crash", "message": text}


def timed_out(text: str) -> bool:
    """Whether an error message is a gloo/NCCL/store timeout's (a hang, not a crash)."""
    return any(w in text.lower() for w in _TIMEOUT_WORDS)


def per_device_batch(cfg: TrainConfig) -> int | None:
    """The per-device batch this process was going to use (for an out-of-memory record): the
    plan's, made as init_context makes it (None when the plan refuses the run)."""
    try:
        return plan(cfg, Environment.detect(), **torchrun_layout(cfg.mode)).per_device_batch
    except ValueError:
        return None


def error_details(exc: BaseException, cfg: TrainConfig) -> dict:
    """A rank's error file fields beyond its message: classify's, plus the attempt."""
    return {**classify(exc, per_device_batch=per_device_batch(cfg)), "attempt": attempt()}


def all_traces(run_dir: Path) -> list[str]:
    """Every attempt's trace files (profiler.runfolder.layout.TRACE_GLOB), relative to the run folder."""
    return sorted(
        p.relative_to(run_dir).as_posix() for p in (run_dir / TRACES_DIR).glob(TRACE_GLOB)
    )


def write_attempt(run_dir: Path, *, attempt_no: int, resumed_from_step: int) -> None:
    """Rank 0 of a restarted attempt notes where it resumed (`logs/attempt<k>.json`)."""
    write_json_atomic(
        run_dir / "logs" / f"attempt{attempt_no}.json",
        {"attempt": attempt_no, "resumed_from_step": resumed_from_step, "time": time.time()},
    )


def read_attempts(run_dir: Path) -> list[Resume]:
    """The run record's `resumes`: where every restarted attempt resumed, in order."""
    out = []
    for p in (run_dir / "logs").glob("attempt*.json"):
        try:
            a = json.loads(p.read_text())
            out.append(Resume(attempt=int(a["attempt"]), resumed_from_step=a["resumed_from_step"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda a: a.attempt)
