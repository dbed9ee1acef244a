"""Host contention, measured by `make bench-comm` on CPU (workloads.comm.bench): how much k
co-located ranks computing at once slow each other's compute, k = 1 .. the run's ranks.

Every rank holds the same fixed compute kernel (matrix products at the rank's torch threads, then
passes over a buffer larger than a core's cache: the mix a training step's forward and backward
make). In each of `REPEATS` rounds, for k = 1 .. n in turn, ranks 0 .. k−1 run the kernel at once
while the others wait in a barrier (a blocked receive, no CPU), so drift hits every k alike.
`slowdown[k]` = median kernel time of the busy ranks at k ÷ the median at k = 1 (rank 0 alone);
`slowdown_min[k]` / `slowdown_max[k]` the smallest / largest over the rounds of each round's median
of the busy ranks ÷ that (1 at k = 1): the range the projection's band takes.
That is the factor `analysis project` applies to compute at k ranks per node. On GPU, ranks do not
share their device's compute: nothing is measured and the projection uses a factor of 1.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["KERNEL", "REPEATS", "measure_contention"]

REPEATS = 7
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


def measure_contention(n: int, rank: int, dev: torch.device, *, threads: int) -> dict:
    """run.json `metrics.host_contention` (the module docstring): `ranks`, `slowdown`,
    `time_ms_alone`, `kernel`, `threads_per_rank`; on GPU only a `note`."""
    if dev.type == "cuda":
        return {"device": "cuda", "ranks": [], "slowdown": [],
                "note": "GPU ranks do not share compute: not measured, factor 1"}  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(384, 384, generator=gen)
    buf = torch.ones(4 << 20)  # 16 MiB of float32
    _kernel(a, buf)  # warm-up: allocator, thread pool
    times = torch.zeros(n, REPEATS, n, dtype=torch.float64)  # [k − 1, round, rank]
    for r in range(REPEATS):
        for k in range(1, n + 1):
            dist.barrier()
            if rank < k:
                times[k - 1, r, rank] = _kernel(a, buf)
            dist.barrier()
    dist.all_reduce(times)  # every rank wrote only its own cells
    t = times.numpy()
    alone = float(np.median(t[0, :, 0]))
    slowdown = [float(np.median(t[k - 1, :, :k]) / alone) for k in range(1, n + 1)]
    # the range over rounds: each round's median of the busy ranks ÷ the median alone (k = 1: 1)
    rounds = [np.median(t[k - 1, :, :k], axis=1) / alone for k in range(2, n + 1)]
    pairs = list(zip(rounds, slowdown[1:], strict=True))
    return {
        "device": "cpu",
        "ranks": list(range(1, n + 1)),
        "slowdown": slowdown,
        "slowdown_min": [1.0, *(float(min(r.min(), s)) for r, s in pairs)],
        "slowdown_max": [1.0, *(float(max(r.max(), s)) for r, s in pairs)],
        "time_ms_alone": 1e3 * alone,
        "kernel": KERNEL,
        "threads_per_rank": threads,
    }
