"""Sort one rank's events into columnar arrays by class: GPU kernels (compute / comm / memory /
other), runtime launches, CPU ops, collective annotations, ProfilerSteps and data-loading ranges.

One pass over the events in Python builds plain lists; everything after is numpy. Kernel names
are classified once per distinct name (`np.unique`), never per row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from analysis.loader import Args, Event, decode_args, decode_correlation

__all__ = [
    "COMM",
    "COMM_KERNEL_RE",
    "COMM_OP_RE",
    "COMPUTE",
    "MEMORY",
    "OTHER",
    "Classified",
    "classify",
    "kernel_class",
]

# HTA 0.5.0 uses `^nccl.*Kernel`; we also take RCCL/HCCL and modern `ncclDevKernel_*` names.
COMM_KERNEL_RE = re.compile(r"^(nccl|rccl|hccl)|nccl(Dev)?Kernel|^hip.*(nccl|rccl)", re.IGNORECASE)
MEMORY_KERNEL_RE = re.compile(r"^(Memcpy|Memset|dma)")
# CPU-side collective annotations written by c10d: `nccl:all_reduce`, `gloo:broadcast`, ...
COMM_OP_RE = re.compile(r"^(nccl|gloo|mpi|ucc|xccl|hccl):")
COMPUTE, COMM, MEMORY, OTHER = 0, 1, 2, 3

_KERNEL_CATS = {"kernel", "Kernel"}
_MEMORY_CATS = {"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"}
_SYNC_CATS = {"cuda_sync"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "Driver"}
_OP_CATS = {"cpu_op", "Operator"}
_ANNOTATION_CATS = {"user_annotation", "python_function", "Python"}
# Host-side ops that only issue a collective: neither computation nor the collective itself.
_ISSUE_OPS = ("c10d::", "record_param_comms")


def kernel_class(name: str, cat: str) -> int:
    """COMPUTE, COMM, MEMORY or OTHER for one GPU activity (HTA's rules, see docs/analysis.md)."""
    if cat in _MEMORY_CATS or MEMORY_KERNEL_RE.match(name) or "Memcpy" in name:
        return MEMORY
    if COMM_KERNEL_RE.search(name):
        return COMM
    if cat in _SYNC_CATS or "Sync" in name:  # Event/Context Sync: GPU time, not computation
        return OTHER
    return COMPUTE


def _arr(values: list[float]) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


@dataclass
class Ranges:
    """Parallel arrays of events of one class (µs relative to the rank's origin)."""

    start: np.ndarray
    end: np.ndarray
    names: list[str] = field(default_factory=list)
    tids: list = field(default_factory=list)
    args: list[Args] = field(default_factory=list)

    @classmethod
    def build(cls, events: list[Event], origin: float, *, keep_args: bool = False) -> Ranges:
        start = _arr([e.ts for e in events]) - origin
        end = start + _arr([e.dur for e in events])
        return cls(
            start,
            end,
            [e.name for e in events],
            [e.tid for e in events],
            [decode_args(e) for e in events] if keep_args else [],
        )

    def __len__(self) -> int:
        return int(self.start.size)


@dataclass
class Classified:
    """One rank's events by class, with times in µs relative to `origin_us` (raw trace clock)."""

    origin_us: float
    kernels: Ranges  # GPU activities: kernels, memcpy/memset, syncs
    kernel_cls: np.ndarray  # COMPUTE/COMM/MEMORY/OTHER per kernel
    launch_us: np.ndarray  # time of the runtime call that launched each kernel (own ts if unknown)
    launch_tid: np.ndarray  # tid of that runtime call (None if unknown)
    steps: Ranges  # ProfilerStep#N, sorted by start
    step_numbers: list[int]
    anchors: Ranges  # nccl:*/gloo:* collective annotations, with args
    rpc: Ranges  # record_param_comms ops, with args
    compute_ops: Ranges  # CPU ops counted as computation on a kernel-less trace
    tb_cpu_ops: Ranges  # tb-profiler's CpuOp role (ops + annotations, no comm/steps/data)
    data: Ranges  # `data` record_function ranges and DataLoader __next__ calls
    cpu_span: tuple[float, float]  # first start / last end of CPU ops (tb-profiler's fallback step)


def _is_data(name: str) -> bool:
    return name == "data" or name.startswith(("enumerate(DataLoader)#", "enumerate(DataPipe)#"))


def classify(events: list[Event]) -> Classified:
    """Bucket `events` (complete 'X' events only) into a Classified rank."""
    kernels, runtime, steps, anchors, rpc, ops, annotations, data = ([] for _ in range(8))
    for e in events:
        if e.ph != "X":
            continue
        cat = e.cat
        if cat in _KERNEL_CATS or cat in _MEMORY_CATS or cat in _SYNC_CATS:
            kernels.append(e)
        elif cat in _RUNTIME_CATS:
            runtime.append(e)
        elif cat in _OP_CATS or cat in _ANNOTATION_CATS:
            name = e.name
            if name.startswith("ProfilerStep#"):
                steps.append(e)
            elif COMM_OP_RE.match(name):
                anchors.append(e)
            elif _is_data(name):
                data.append(e)
            elif name == "record_param_comms":
                rpc.append(e)
            elif cat in _OP_CATS:
                ops.append(e)
            else:
                annotations.append(e)
    cpu_like = [e for e in (*ops, *anchors, *rpc, *steps) if e.cat not in _ANNOTATION_CATS]
    all_x = kernels or cpu_like or steps or anchors or annotations
    if not all_x:
        origin = 0.0
    else:
        origin = min(
            min((e.ts for e in kernels), default=np.inf),
            min((e.ts for e in cpu_like), default=np.inf),
            min((e.ts for e in steps), default=np.inf),
            min((e.ts for e in anchors), default=np.inf),
            min((e.ts for e in annotations), default=np.inf),
        )
    cpu_span = (
        min((e.ts for e in cpu_like), default=origin) - origin,
        max((e.ts + e.dur for e in cpu_like), default=origin) - origin,
    )

    k = Ranges.build(kernels, origin, keep_args=True)
    names, inverse = (
        np.unique(np.asarray(k.names, dtype=object), return_inverse=True)
        if len(k)
        else (np.empty(0, dtype=object), np.empty(0, dtype=np.intp))
    )
    cats = {n: c for n, c in zip(k.names, (e.cat for e in kernels), strict=True)}
    kernel_cls = (
        np.asarray([kernel_class(n, cats[n]) for n in names], dtype=np.int8)[inverse]
        if len(k)
        else np.empty(0, dtype=np.int8)
    )
    launch_us, launch_tid = _launches(k, runtime, origin)

    steps.sort(key=lambda e: e.ts)
    step_numbers = [
        int(m) if (m := e.name.split("#", 1)[1].split()[0]).isdigit() else i
        for i, e in enumerate(steps)
    ]
    anchors.sort(key=lambda e: e.ts)
    issue = [e for e in ops if e.name.startswith(_ISSUE_OPS)]
    compute = [e for e in ops if not e.name.startswith(_ISSUE_OPS)]
    return Classified(
        origin_us=float(origin),
        kernels=k,
        kernel_cls=kernel_cls,
        launch_us=launch_us,
        launch_tid=launch_tid,
        steps=Ranges.build(steps, origin),
        step_numbers=step_numbers,
        anchors=Ranges.build(anchors, origin, keep_args=True),
        rpc=Ranges.build(rpc, origin, keep_args=True),
        compute_ops=Ranges.build(compute, origin),
        tb_cpu_ops=Ranges.build([*compute, *issue, *rpc, *annotations], origin),
        data=Ranges.build(data, origin),
        cpu_span=cpu_span,
    )


def _launches(k: Ranges, runtime: list[Event], origin: float) -> tuple[np.ndarray, np.ndarray]:
    """Launch time and thread of each kernel, joined on the correlation id of its runtime call."""
    launch = k.start.copy()
    tids = np.full(len(k), None, dtype=object)
    if not len(k) or not runtime:
        return launch, tids
    rt_corr = np.fromiter((decode_correlation(e) for e in runtime), np.int64, len(runtime))
    order = np.argsort(rt_corr, kind="stable")
    rt_sorted = rt_corr[order]
    k_corr = np.asarray(
        [a.correlation if a.correlation is not None else -2 for a in k.args], dtype=np.int64
    )
    pos = np.clip(np.searchsorted(rt_sorted, k_corr), 0, rt_sorted.size - 1)
    hit = rt_sorted[pos] == k_corr
    rt_idx = order[pos]
    rt_ts = _arr([e.ts for e in runtime]) - origin
    launch[hit] = rt_ts[rt_idx[hit]]
    tids[hit] = np.asarray([e.tid for e in runtime], dtype=object)[rt_idx[hit]]
    return launch, tids
