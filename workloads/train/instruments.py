"""The callbacks of dpscope's training loop (workloads.train.loop), built once per rank.

The torch-level ones come from profiler.callbacks, built by profiler.recorder.recording, as a
RunRecorder (and so the `--script` bootstrap) builds them: one writer of step rows; the launcher's (fault injection, heartbeat)
from workloads.launch; `--save-final` from workloads.train.checkpoint. The order of the list is
the order of the loop module's docstring.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from profiler.callbacks import (
    Callback,
    Callbacks,
    HostLoadSampler,
    MemorySampler,
    ProfilerStep,
    StaticMemoryCount,
    StepRecorder,
    StepState,
)
from profiler.recording import recording
from profiler.session import ProfileConfig
from workloads.config import TrainConfig
from workloads.launch import faults
from workloads.launch.heartbeat import Heartbeat, HeartbeatCallback
from workloads.train.checkpoint import SaveFinal
from workloads.train.context import RunContext

__all__ = ["Instruments", "ProgressBar", "build_instruments"]


class ProgressBar(Callback):
    """tqdm on rank 0's terminal: one tick per step, with the step's loss."""

    def __init__(self, ctx: RunContext, *, planned: int, first_step: int) -> None:
        self.bar = tqdm(
            total=planned,
            initial=first_step,
            desc=f"{ctx.mode} train",
            unit="step",
            disable=not ctx.is_main,
            file=sys.__stderr__,
        )

    def step_end(self, state: StepState) -> None:
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{state.loss_value:.4f}", refresh=False)

    def run_end(self, state: StepState) -> None:
        self.bar.close()


@dataclass(kw_only=True)
class Instruments:
    """The loop's callbacks, and by name the ones whose results the run record takes."""

    recorder: StepRecorder
    static: StaticMemoryCount
    profiler: ProfilerStep
    memory: MemorySampler
    host: HostLoadSampler
    callbacks: Callbacks


def build_instruments(
    cfg: TrainConfig,
    ctx: RunContext,
    run_dir: Path,
    beat: Heartbeat,
    *,
    planned: int,
    first_step: int,
    extra: Sequence[Callback],
) -> Instruments:
    """Every callback of the loop, in the order of the module docstring."""
    attempt_no = beat.attempt
    rec = recording(
        rank=ctx.rank,
        devices=list(ctx.devices),
        profile=ProfileConfig(**cfg.profile_kwargs()),
        trace_dir=run_dir / "traces",
        # A restarted attempt's traces get names of their own (rank<r>_attempt<k>.<ts>...).
        worker_name=("dp" if ctx.mode == "dp" else f"rank{ctx.rank}")
        + (f"_attempt{attempt_no}" if attempt_no else ""),
        warmup_steps=cfg.warmup_steps,
        planned_steps=planned - first_step,
    )
    inst = Instruments(
        recorder=rec.recorder,
        static=rec.static,
        profiler=rec.profiler,
        memory=rec.memory,
        host=rec.host,
        callbacks=Callbacks([]),
    )
    # FSDP's full state dict is a collective: every rank takes part, rank 0 writes.
    saves = ctx.is_main or ctx.mode == "fsdp"
    final = [SaveFinal(run_dir / "final.pt", ctx)] if cfg.save_final and saves else []
    inst.callbacks = Callbacks(
        [
            inst.recorder,
            inst.static,
            inst.profiler,
            inst.memory,
            inst.host,
            *final,
            faults.FaultInjection.from_env(rank=ctx.rank, stop=cfg.stop_on_nonfinite),
            HeartbeatCallback(beat),
            ProgressBar(ctx, planned=planned, first_step=first_step),
            *extra,
        ]
    )
    return inst
