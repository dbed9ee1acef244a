"""Sort one rank's events into columnar arrays by class: GPU kernels (compute / comm / memory /
other), runtime launches, CPU ops, collective annotations, ProfilerSteps and data-loading ranges.

Events arrive in chunks (see loader.py); each chunk is bucketed in one Python pass and reduced to
numpy columns before the next, and everything after is numpy. Kernel names are classified once
per distinct name, never per row.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from analysis.trace.attribution import launches
from analysis.trace.loader import (
    MAX_SPAN_US,
    Args,
    ChunkSplitError,
    Event,
    decode_args,
    decode_correlation,
)
from analysis.trace.memory import MemoryAccumulator, MemoryEvents
from analysis.trace.steps import clean_steps
from analysis.trace.tbprofiler import NO_ID, TbAccumulator, TbRoles

__all__ = [
    "COMM",
    "COMM_KERNEL_RE",
    "COMM_OP_RE",
    "COMPUTE",
    "MAX_DUR_US",
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
_OPS, _ISSUE, _OTHER_OP = 0, 1, 2  # op_events roles: computation, issue-only, the rest
# No profiled event lasts longer than this (one day): a longer `dur` is corrupt, not slow.
MAX_DUR_US = MAX_SPAN_US
_INF = float("inf")

_KERNEL_CATS = {"kernel", "Kernel"}
_MEMORY_CATS = {"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"}
_SYNC_CATS = {"cuda_sync"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "Driver"}
_OP_CATS = {"cpu_op", "Operator"}
_ANNOTATION_CATS = {"user_annotation", "python_function", "Python"}
# Host-side ops that only issue a collective: neither computation nor the collective itself.
_ISSUE_OPS = ("c10d::", "record_param_comms")


def kernel_class(name: str, cat: str) -> int:
    """COMPUTE, COMM, MEMORY or OTHER for one GPU activity (HTA's rules, see docs/reference/metrics.md)."""
    if cat in _MEMORY_CATS or MEMORY_KERNEL_RE.match(name) or "Memcpy" in name:
        return MEMORY
    if COMM_KERNEL_RE.search(name):
        return COMM
    if cat in _SYNC_CATS or "Sync" in name:  # Event/Context Sync: GPU time, not computation
        return OTHER
    return COMPUTE


def _arr(values) -> np.ndarray:
    return np.fromiter(values, dtype=np.float64)


@dataclass
class Ranges:
    """Parallel arrays of events of one class (µs relative to the rank's origin)."""

    start: np.ndarray
    end: np.ndarray
    names: list[str] = field(default_factory=list)
    tids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # thread codes
    args: list[Args | None] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.start.size)


class _Columns:
    """Accumulates one class of events chunk by chunk as compact columns (absolute µs)."""

    def __init__(
        self, codes: dict, *, names: bool = False, tids: bool = False, args: bool = False
    ) -> None:
        # Thread ids become small integer codes (shared by all classes of a rank) and names
        # share one string per distinct name: no per-event Python objects outlive their chunk,
        # so freed chunks give their memory back instead of pinning the allocator's arenas.
        self.codes = codes
        self.keep = (names, tids, args)
        self.ts: list[np.ndarray] = []
        self.dur: list[np.ndarray] = []
        self.names: list[str] = []
        self.tids: list[np.ndarray] = []
        self.args: list[Args] = []

    def add(self, events: list[Event]) -> None:
        if not events:
            return
        self.ts.append(_arr(e.ts for e in events))
        self.dur.append(_arr(e.dur for e in events))
        names, tids, args = self.keep
        if names:
            self.names += [self.codes.setdefault(("name", e.name), e.name) for e in events]
        if tids:
            codes = self.codes
            self.tids.append(
                np.fromiter(
                    (codes.setdefault(e.tid, len(codes)) for e in events), np.int64, len(events)
                )
            )
        if args:
            self.args += [decode_args(e) for e in events]

    def first(self) -> float:
        return min((float(t.min()) for t in self.ts), default=np.inf)

    def ranges(self, origin: float) -> Ranges:
        start = np.concatenate(self.ts) - origin if self.ts else np.empty(0)
        end = start + (np.concatenate(self.dur) if self.dur else np.empty(0))
        tids = np.concatenate(self.tids) if self.tids else np.empty(0, np.int64)
        return Ranges(start, end, self.names, tids, self.args)


@dataclass
class Classified:
    """One rank's events by class, with times in µs relative to `origin_us` (itself relative to
    the trace's base, `LoadedTrace.ts_base_us`)."""

    origin_us: float
    kernels: Ranges  # GPU activities: kernels, memcpy/memset, syncs
    kernel_cls: np.ndarray  # COMPUTE/COMM/MEMORY/OTHER per kernel
    launch_us: np.ndarray  # time of the runtime call that launched each kernel (own ts if unknown)
    launch_tid: np.ndarray  # thread code of that runtime call (-1 if unknown)
    orphan: np.ndarray  # per kernel: no runtime launch matches it (attribution.py's rule)
    steps: Ranges  # ProfilerStep#N, sorted by start
    step_numbers: list[int]
    step_notes: list[str]  # ProfilerSteps dropped as duplicates or overlaps (steps.py)
    anchors: Ranges  # nccl:*/gloo:* collective annotations, with args
    rpc: Ranges  # record_param_comms ops, with args
    c10d: Ranges  # c10d::* ops (the collective each call issued: analysis.trace.c10d), with args
    compute_ops: Ranges  # CPU ops (all threads, no names); computation on a kernel-less trace
    tb: TbRoles  # what torch-tb-profiler keeps, by its own rules (tbprofiler.py)
    data: Ranges  # `data` record_function ranges and DataLoader __next__ calls
    op_events: Ranges  # operators for the per-op table: cpu_op events and collective calls
    op_role: np.ndarray  # per op event: _OPS (compute_ops), _ISSUE, _OTHER_OP
    cpu_span: tuple[float, float]  # first start / last end of CPU ops (tb-profiler's fallback step)
    # 'X' events dropped for impossible times, and events of the wrong shape (loader.IMPOSSIBLE)
    dropped_events: int = 0
    memory: MemoryEvents | None = None  # [memory] events and phase ranges (analysis.trace.memory)


def _is_data(name: str) -> bool:
    return name == "data" or name.startswith(("enumerate(DataLoader)#", "enumerate(DataPipe)#"))


class _Accumulator:
    """Everything `classify` keeps from the events, filled one chunk at a time."""

    def __init__(self) -> None:
        codes: dict = {}
        self.kernels = _Columns(codes, names=True)
        self.kernel_cls: list[int] = []
        self.kernel_corr: list[np.ndarray] = []
        self.runtime = _Columns(codes, tids=True)
        self.runtime_corr: list[np.ndarray] = []
        self.steps = _Columns(codes, names=True, tids=True)  # their thread is the training thread
        self.anchors = _Columns(codes, names=True, tids=True, args=True)
        self.rpc = _Columns(codes, tids=True, args=True)
        self.c10d = _Columns(codes, names=True, tids=True, args=True)
        self.tb = TbAccumulator()
        self.data = _Columns(codes)
        self.op_events = _Columns(codes, names=True, tids=True)  # ops, issue ops, then the rest
        self.op_role: list[np.ndarray] = []
        self.cpu_lo, self.cpu_hi = np.inf, -np.inf
        self.class_of: dict[tuple[str, str], int] = {}  # kernel classes, once per distinct name
        self.dropped = 0  # complete events with impossible times (see MAX_DUR_US)
        self.memory = MemoryAccumulator()

    def add(self, events: list[Event]) -> None:
        self.memory.add(events)
        b = self._bucket(events)
        corr, tb_ext = self._kernel_ids(b.kernels)
        self.kernel_corr.append(corr)
        self.kernels.add(b.kernels)
        self.runtime.add(b.runtime)
        self.runtime_corr.append(
            np.fromiter((decode_correlation(e) for e in b.runtime), np.int64, len(b.runtime))
        )
        self.steps.add(b.steps)
        self.anchors.add(b.anchors)
        self.rpc.add(b.rpc)
        self.c10d.add([e for e in b.issue if e.name.startswith("c10d::")])
        self.tb.add_kernels(b.kernels, tb_ext, [NO_ID if c == -2 else c for c in corr.tolist()])
        self.tb.add_host([*b.steps, *b.anchors, *b.data, *b.rpc, *b.runtime, *b.tb])
        self.data.add(b.data)
        self._add_ops(b)

    def _bucket(self, events: list[Event]) -> _Buckets:
        """One Python pass over a chunk: each complete event into its class's bucket."""
        b = _Buckets()
        for e in events:
            if e.ph != "X":
                continue
            # Impossible times (missing, negative, non-finite, absurdly long) are dropped and
            # counted, never analysed: one such ProfilerStep would poison every mean.
            if not (0.0 <= e.dur <= MAX_DUR_US and -_INF < e.ts < _INF):
                self.dropped += 1
                continue
            cat = e.cat
            if cat in _KERNEL_CATS or cat in _MEMORY_CATS or cat in _SYNC_CATS:
                b.kernels.append(e)
            elif cat in _RUNTIME_CATS:
                b.runtime.append(e)
            elif cat in _OP_CATS or cat in _ANNOTATION_CATS:
                _bucket_op(b, e, cat)
            else:
                b.tb.append(e)  # other categories: only tb-profiler may keep some
        return b

    def _kernel_ids(self, kernels: list[Event]) -> tuple[np.ndarray, list[int]]:
        """Classify each kernel (once per distinct name) and keep the comm kernels' args;
        returns (correlation ids, -2 for none; tb-profiler's external ids)."""
        corr = np.empty(len(kernels), np.int64)
        tb_ext: list[int] = []
        for i, e in enumerate(kernels):
            key = (e.name, e.cat)
            if key not in self.class_of:
                self.class_of[key] = kernel_class(*key)
            cls = self.class_of[key]
            self.kernel_cls.append(cls)
            args = decode_args(e)
            corr[i] = args.correlation if args.correlation is not None else -2
            ext = args.external_id_lc if args.external_id_lc is not None else args.external_id
            tb_ext.append(NO_ID if ext is None else ext)  # tb-profiler's order of the two keys
            # Only comm kernels need their args later (linking, sizes); drop the rest now.
            self.kernels.args.append(args if cls == COMM else None)
        return corr, tb_ext

    def _add_ops(self, b: _Buckets) -> None:
        """The per-op table's events with their roles, and the CPU span tb-profiler falls back to."""
        rest = [*b.anchors, *(e for e in (*b.rpc, *b.data) if e.cat in _OP_CATS)]
        self.op_events.add([*b.ops, *b.issue, *rest])
        self.op_role.append(
            np.repeat(
                np.array([_OPS, _ISSUE, _OTHER_OP], np.int8),
                [len(b.ops), len(b.issue), len(rest)],
            )
        )
        cpu_like = [
            e
            for e in (*b.ops, *b.issue, *b.anchors, *b.rpc, *b.steps)
            if e.cat not in _ANNOTATION_CATS
        ]
        if cpu_like:
            self.cpu_lo = min(self.cpu_lo, min(e.ts for e in cpu_like))
            self.cpu_hi = max(self.cpu_hi, max(e.ts + e.dur for e in cpu_like))

    def finish(self) -> Classified:
        parts = (
            self.kernels,
            self.steps,
            self.anchors,
            self.rpc,
            self.op_events,
            self.data,
        )  # c10d ⊂ ops
        origin = min(min(p.first() for p in parts), self.cpu_lo, self.tb.first)
        origin = 0.0 if not np.isfinite(origin) else float(origin)
        op_events = self.op_events.ranges(origin)
        role = np.concatenate(self.op_role) if self.op_role else np.empty(0, np.int8)
        is_op, plain = role == _OPS, role != _OTHER_OP
        k = self.kernels.ranges(origin)
        rt = self.runtime.ranges(origin)
        corr = np.concatenate(self.runtime_corr) if self.runtime_corr else np.empty(0, np.int64)
        k_corr = np.concatenate(self.kernel_corr) if self.kernel_corr else np.empty(0, np.int64)
        launch_us, launch_tid, orphan = launches(k.start, k_corr, rt.start, rt.tids, corr)
        steps = _by_start(self.steps.ranges(origin))
        keep, numbers, bad_steps, step_notes = clean_steps(steps.names, steps.start, steps.end)
        steps = _select(steps, keep)
        span = (
            (self.cpu_lo - origin, self.cpu_hi - origin) if np.isfinite(self.cpu_lo) else (0.0, 0.0)
        )
        return Classified(
            origin_us=origin,
            kernels=k,
            kernel_cls=np.asarray(self.kernel_cls, dtype=np.int8),
            launch_us=launch_us,
            launch_tid=launch_tid,
            orphan=orphan,
            steps=steps,
            step_numbers=numbers,
            step_notes=step_notes,
            anchors=_by_start(self.anchors.ranges(origin), args=True),
            rpc=self.rpc.ranges(origin),
            c10d=_by_start(self.c10d.ranges(origin), args=True),
            compute_ops=Ranges(
                op_events.start[is_op], op_events.end[is_op], tids=op_events.tids[is_op]
            ),
            tb=self.tb.finish(origin, op_events.start[plain], op_events.end[plain]),
            data=self.data.ranges(origin),
            op_events=op_events,
            op_role=role,
            cpu_span=span,
            dropped_events=self.dropped + bad_steps,
            memory=self.memory.finish(origin),
        )


@dataclass
class _Buckets:
    """One chunk's complete events by class, before they become columns."""

    kernels: list[Event] = field(default_factory=list)
    runtime: list[Event] = field(default_factory=list)
    steps: list[Event] = field(default_factory=list)
    anchors: list[Event] = field(default_factory=list)
    rpc: list[Event] = field(default_factory=list)
    ops: list[Event] = field(default_factory=list)
    issue: list[Event] = field(default_factory=list)
    data: list[Event] = field(default_factory=list)
    tb: list[Event] = field(default_factory=list)


def _bucket_op(b: _Buckets, e: Event, cat: str) -> None:
    """A CPU op or annotation: ProfilerStep, collective call, data range, record_param_comms,
    issue-only op or operator; other user ranges (forward, backward, ...) are not operators."""
    name = e.name
    if name.startswith("ProfilerStep#"):
        b.steps.append(e)
    elif COMM_OP_RE.match(name):
        b.anchors.append(e)
    elif _is_data(name):
        b.data.append(e)
    elif name == "record_param_comms":
        b.rpc.append(e)
    elif cat not in _OP_CATS:
        if cat == "Python":  # tb-profiler counts these as CPU ops
            b.tb.append(e)
    elif name.startswith(_ISSUE_OPS):
        b.issue.append(e)
    else:
        b.ops.append(e)


def _select(r: Ranges, mask: np.ndarray) -> Ranges:
    idx = np.flatnonzero(mask)
    return Ranges(r.start[idx], r.end[idx], [r.names[i] for i in idx], r.tids[idx])


def _by_start(r: Ranges, *, args: bool = False) -> Ranges:
    """`r` sorted by start (stable), names and thread codes (and args) along."""
    order = np.argsort(r.start, kind="stable")
    kept = [r.args[i] for i in order] if args else []
    return Ranges(r.start[order], r.end[order], [r.names[i] for i in order], r.tids[order], kept)


def classify(passes: Iterator[Iterator[list[Event]]]) -> Classified:
    """Bucket the events (complete 'X' events only) of a trace, chunk by chunk, into a
    Classified rank. `passes` is `LoadedTrace.event_chunks()`: when a chunked pass fails
    (ChunkSplitError) the next pass decodes everything at once."""
    for chunks in passes:
        acc = _Accumulator()
        try:
            for events in chunks:
                acc.add(events)
        except ChunkSplitError:
            continue
        return acc.finish()
    raise AssertionError("the last pass never raises ChunkSplitError")
