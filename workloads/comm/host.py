"""Host contention, measured by `make bench-comm` on CPU (workloads.comm.bench): how much k
co-located ranks computing at once slow each other's compute, k = 1 .. the run's ranks.

Every rank holds the same fixed compute kernel (matrix products at the rank's torch threads, then
passes over a buffer larger than a core's cache: the mix a training step's forward and backward
make). A round runs, for k = 1 .. n in turn, the kernel on ranks 0 .. k−1 at once while the
others wait in a barrier (a blocked receive, no CPU). `ROUNDS` rounds are taken in each of
three windows spread over the comm run (before the size sweep, before the idle sweep, after
it: `ContentionSampler`), because a shared VM's state moves for seconds at a time: one comm run
with a single window measured ×1.89, the nine after it on the same quiet VM ×1.04–1.16, and two
single-device trainings at once ran within 10% of one alone (2026-12-07).
- A round's ratio at k = the median kernel time of its busy ranks at k ÷ rank 0's time alone in
  the same round (paired, so the machine's speed moving between windows cancels).
- `slowdown[k]` = the median of the rounds' ratios (a transient that holds one window is a
  minority of the rounds and cannot set it); `slowdown_min[k]` / `slowdown_max[k]` their
  smallest / largest (1 at k = 1): the range the projection's band takes.
That is the factor `analysis project` applies to compute at k ranks per node. On GPU, ranks do not
share their device's compute: nothing is measured and the projection uses a factor of 1.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["KERNEL", "ROUNDS", "ContentionSampler", "contention_from_times"]

ROUNDS = 7
"""Rounds per window (workloads.comm.bench takes a window at each of its three phases)."""
KERNEL = "8 matmuls of 384×384 float32, then 4 passes over a 16 MiB buffer"


def _kernel(a: torch.Tensor, buf: torch.Tensor) -> float:
    """Seconds of one run of the fixed compute kernel on this rank."""
    t0 = time.perf_counter()
    x = a
    for _ in range(8):
        x = torch.relu(x @ a) * 1e-3
    for _ in range(4):
        buf.mul_(1.0001)
    return time.perf_counter() - t0


def contention_from_times(times: np.ndarray) -> dict:
    """`slowdown`, `slowdown_min`, `slowdown_max` (each per k = 1 .. n) and `time_ms_alone` from
    the kernel's seconds `times[k − 1, round, rank]` (0 where a rank was idle): the module
    docstring's paired per-round ratios."""
    n = times.shape[0]
    alone = times[0, :, 0]
    ratios = [np.median(times[k - 1, :, :k], axis=1) / alone for k in range(1, n + 1)]
    return {
        "slowdown": [float(np.median(r)) for r in ratios],
        "slowdown_min": [1.0, *(float(r.min()) for r in ratios[1:])],
        "slowdown_max": [1.0, *(float(r.max()) for r in ratios[1:])],
        "time_ms_alone": 1e3 * float(np.median(alone)),
    }


class ContentionSampler:
    """Collective over the ranks of a comm run: `sample()` takes one window of ROUNDS rounds
    (every rank calls it at the same point), `result()` all-reduces them into run.json
    `metrics.host_contention` (the module docstring); on GPU nothing is measured."""

    def __init__(self, n: int, rank: int, dev: torch.device, *, threads: int) -> None:
        self.n, self.rank, self.threads, self.cpu = n, rank, threads, dev.type != "cuda"
        self._rounds: list[torch.Tensor] = []  # one [k − 1, rank] tensor per round
        if self.cpu:
            gen = torch.Generator().manual_seed(0)
            self._a = torch.randn(384, 384, generator=gen)
            self._buf = torch.ones(4 << 20)  # 16 MiB of float32
            _kernel(self._a, self._buf)  # warm-up: allocator, thread pool

    def sample(self, rounds: int = ROUNDS) -> None:
        """One window: `rounds` rounds of k = 1 .. n busy ranks."""
        if not self.cpu:
            return
        for _ in range(rounds):
            t = torch.zeros(self.n, self.n, dtype=torch.float64)
            for k in range(1, self.n + 1):
                dist.barrier()
                if self.rank < k:
                    t[k - 1, self.rank] = _kernel(self._a, self._buf)
                dist.barrier()
            self._rounds.append(t)

    def result(self) -> dict:
        """run.json `metrics.host_contention`: `ranks`, `slowdown` (with its min and max),
        `time_ms_alone`, `kernel`, `threads_per_rank`, `windows`; on GPU only a `note`."""
        if not self.cpu:
            return {"device": "cuda", "ranks": [], "slowdown": [],
                    "note": "GPU ranks do not share compute: not measured, factor 1"}  # fmt: skip
        times = torch.stack(self._rounds, dim=1)  # [k − 1, round, rank]
        dist.all_reduce(times)  # every rank wrote only its own cells
        return {
            "device": "cpu",
            "ranks": list(range(1, self.n + 1)),
            **contention_from_times(times.numpy()),
            "kernel": KERNEL,
            "threads_per_rank": self.threads,
            "windows": len(self._rounds) // ROUNDS,
        }
