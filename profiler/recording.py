"""The instruments every recorded training loop runs first (docs/callbacks.md), built in one
place for dpscope's loop (workloads.train.instruments), RunRecorder (profiler.recorder) and so the
`--script` bootstrap: the step recorder (the one writer of steps.csv rows), the static memory
count, the profiler session, the memory sampler and rank 0's host-load sampler.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from profiler.callbacks import (
    HostLoadSampler,
    MemorySampler,
    ProfilerStep,
    StaticMemoryCount,
    StepRecorder,
)
from profiler.memory import MemoryTracker
from profiler.memory_breakdown import StaticMemory
from profiler.session import ProfileConfig, ProfilerSession
from profiler.timers import StepTimer

__all__ = ["Recording", "recording"]


@dataclass(kw_only=True)
class Recording:
    """The instruments every recorded loop runs first, in this order (docs/callbacks.md)."""

    recorder: StepRecorder
    static: StaticMemoryCount
    profiler: ProfilerStep
    memory: MemorySampler
    host: HostLoadSampler  # env.host_load, rank 0 only

    def callbacks(self) -> list:
        return [self.recorder, self.static, self.profiler, self.memory, self.host]


def recording(
    *,
    rank: int,
    devices: list[torch.device],
    profile: ProfileConfig,
    trace_dir: Path,
    worker_name: str,
    warmup_steps: int,
    planned_steps: int,
) -> Recording:
    """The step recorder, static memory count, profiler session, memory sampler and (rank 0)
    host-load sampler of one rank (dpscope's loop, workloads.train.instruments, and RunRecorder
    build them here)."""
    device = devices[0]
    return Recording(
        recorder=StepRecorder(StepTimer(device=device), warmup_steps=warmup_steps),
        static=StaticMemoryCount(
            StaticMemory(rank=rank, devices=devices, planned_steps=max(1, planned_steps))
        ),
        profiler=ProfilerStep(
            ProfilerSession(
                profile,
                trace_dir=trace_dir,
                worker_name=worker_name,
                use_cuda=device.type == "cuda",
            )
        ),
        memory=MemorySampler(MemoryTracker(rank=rank, devices=devices)),
        host=HostLoadSampler(warmup_steps=warmup_steps, enabled=rank == 0),
    )
