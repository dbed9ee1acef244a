"""Sort one rank's events into columnar arrays by class: GPU kernels (compute / comm / memory /
other), runtime launches, CPU ops, collective annotations, ProfilerSteps and data-loading ranges.

Events arrive in chunks (see loader.py). Each chunk becomes columns at once: one code per event
from the rank's vocabulary (roles.py: what a (ph, cat, name) is, decided once per distinct key),
its rebased start and its duration; each class is then a numpy selection in event order, and only
the few fields a class needs (thread, args) are read from its own events. Nothing per event
outlives its chunk, and everything after is numpy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from analysis.trace.attribution import launches
from analysis.trace.events import Args, Event
from analysis.trace.loader import MAX_SPAN_US, ChunkSplitError
from analysis.trace.memory import MemoryAccumulator, MemoryEvents
from analysis.trace.roles import (
    COMM,
    COMM_KERNEL_RE,
    COMM_OP_RE,
    COMPUTE,
    MEMORY,
    OTHER,
    TB_NONE,
    Role,
    Vocab,
    kernel_class,
)
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

_OPS, _ISSUE, _OTHER_OP = 0, 1, 2  # op_events roles: computation, issue-only, the rest
# No profiled event lasts longer than this (one day): a longer `dur` is corrupt, not slow.
MAX_DUR_US = MAX_SPAN_US
_INF = float("inf")
_DUR, _TID, _ARGS = attrgetter("dur"), attrgetter("tid"), attrgetter("args")
EMPTY_ARGS = Args()


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


class _Columns:
    """One class of events, chunk by chunk, as compact columns (µs relative to the base)."""

    def __init__(self) -> None:
        self.ts: list[np.ndarray] = []
        self.dur: list[np.ndarray] = []
        self.names: list[str] = []
        self.tids: list[np.ndarray] = []
        self.args: list[Args | None] = []

    def add(self, c: _Chunk, idx: np.ndarray, *, names=None, tids=None, args=None) -> None:
        self.ts.append(c.ts[idx])
        self.dur.append(c.dur[idx])
        if names is not None:
            self.names += names
        if tids is not None:
            self.tids.append(tids)
        if args is not None:
            self.args += args

    def first(self) -> float:
        return min((float(t.min()) for t in self.ts if t.size), default=np.inf)

    def ranges(self, origin: float) -> Ranges:
        start = np.concatenate([np.empty(0), *self.ts]) - origin
        end = start + np.concatenate([np.empty(0), *self.dur])
        tids = np.concatenate([np.empty(0, np.int64), *self.tids])
        return Ranges(start, end, self.names, tids, self.args)


class _Chunk:
    """One chunk as columns: each event's vocabulary code, rebased start and duration, and the
    indices of each class (Role) in event order."""

    def __init__(self, events: list[Event], ts: np.ndarray, vocab: Vocab) -> None:
        self.events, self.ts, self.vocab = events, ts, vocab
        self.code = vocab.encode(events)
        self.dur = np.fromiter(map(_DUR, events), np.float64, len(events))
        # Impossible times (missing, negative, non-finite, absurdly long) are dropped and
        # counted, never analysed: one such ProfilerStep would poison every mean.
        with np.errstate(invalid="ignore"):
            ok = (self.dur >= 0.0) & (self.dur <= MAX_DUR_US) & (ts > -_INF) & (ts < _INF)
        self.dropped = int((vocab.table("is_x")[self.code] & ~ok).sum())
        role = np.where(ok, vocab.table("role")[self.code], Role.NONE)
        order = np.argsort(role, kind="stable")
        bounds = np.searchsorted(role[order], np.arange(Role.TB + 2))
        self.idx = [order[bounds[r] : bounds[r + 1]] for r in range(Role.TB + 1)]

    def __getitem__(self, role: int) -> np.ndarray:
        return self.idx[role]

    def prop(self, idx: np.ndarray, table: str) -> np.ndarray:
        """The vocabulary property `table` of the events `idx`."""
        return self.vocab.table(table)[self.code[idx]]

    def names(self, idx: np.ndarray) -> list[str]:
        names = self.vocab.names
        return [names[c] for c in self.code[idx].tolist()]

    def args(self, idx: np.ndarray) -> list[Args | None]:
        return list(map(_ARGS, map(self.events.__getitem__, idx.tolist())))

    def end(self, idx: np.ndarray) -> np.ndarray:
        return self.ts[idx] + self.dur[idx]


def _ext_id(a: Args | None) -> int:
    """tb-profiler's external id: 'external id' before 'External id'; NO_ID when absent."""
    if a is None:
        return NO_ID
    ext = a.external_id_lc if a.external_id_lc is not None else a.external_id
    return NO_ID if ext is None else ext


class _Accumulator:
    """Everything `classify` keeps from the events, filled one chunk at a time."""

    def __init__(self) -> None:
        # Names are the vocabulary's one string per distinct name and thread ids small integer
        # codes (shared by all classes of a rank, numbered in first-seen order): no per-event
        # Python object outlives its chunk, so freed chunks give their memory back.
        self.vocab = Vocab()
        self.tid_codes: dict[int | str, int] = {}
        self.kernels, self.runtime, self.steps = _Columns(), _Columns(), _Columns()
        self.anchors, self.rpc, self.data = _Columns(), _Columns(), _Columns()
        self.c10d = _Columns()
        self.op_events = _Columns()  # per chunk: ops, issue ops, then the rest
        self.kernel_cls: list[np.ndarray] = []
        self.kernel_corr: list[np.ndarray] = []
        self.runtime_corr: list[np.ndarray] = []
        self.op_role: list[np.ndarray] = []
        self.tb = TbAccumulator()
        self.cpu_lo, self.cpu_hi = np.inf, -np.inf
        self.dropped = 0  # complete events with impossible times (see MAX_DUR_US)
        self.memory = MemoryAccumulator()

    def _tids(self, c: _Chunk, idx: np.ndarray) -> np.ndarray:
        codes = self.tid_codes
        tids = list(map(_TID, map(c.events.__getitem__, idx.tolist())))
        for t in dict.fromkeys(tids):  # new threads numbered in first-seen order
            if t not in codes:
                codes[t] = len(codes)
        return np.fromiter(map(codes.__getitem__, tids), np.int64, idx.size)

    def add(self, events: list[Event], ts: np.ndarray) -> None:
        c = _Chunk(events, ts, self.vocab)
        self.dropped += c.dropped
        self.memory.add_chunk(
            events, ts, c.dur, c.prop(slice(None), "memory"), c.prop(slice(None), "phase")
        )
        self._add_kernels(c)
        rt = c[Role.RUNTIME]
        self.runtime.add(c, rt, tids=self._tids(c, rt))
        # `or -1`: a correlation id of 0 is no id (as for every launch before)
        corr = ((a.correlation or -1) if a is not None else -1 for a in c.args(rt))
        self.runtime_corr.append(np.fromiter(corr, np.int64, rt.size))
        i = c[Role.STEP]
        self.steps.add(c, i, names=c.names(i), tids=self._tids(c, i))
        i = c[Role.ANCHOR]
        args = [a or EMPTY_ARGS for a in c.args(i)]
        self.anchors.add(c, i, names=c.names(i), tids=self._tids(c, i), args=args)
        i = c[Role.RPC]
        self.rpc.add(c, i, tids=self._tids(c, i), args=[a or EMPTY_ARGS for a in c.args(i)])
        self._add_c10d(c)
        self.data.add(c, c[Role.DATA])
        self._add_host(c)
        self._add_ops(c)

    def _add_c10d(self, c: _Chunk) -> None:
        """The issue-only ops that are c10d collectives, with their shapes (analysis.trace.c10d)."""
        issue = c[Role.ISSUE]
        names = c.names(issue)
        keep = np.fromiter((n.startswith("c10d::") for n in names), bool, issue.size)
        i = issue[keep]
        args = [a or EMPTY_ARGS for a in c.args(i)]
        self.c10d.add(c, i, names=[n for n, k in zip(names, keep, strict=True) if k],
                      tids=self._tids(c, i), args=args)  # fmt: skip

    def _add_kernels(self, c: _Chunk) -> None:
        """Kernel classes (once per distinct name, by the vocabulary), correlation ids (-2 for
        none), tb-profiler's ids, and the args of comm kernels only (linking and sizes)."""
        k = c[Role.KERNEL]
        cls = c.prop(k, "kernel_cls")
        args = c.args(k)
        none = (a is None or a.correlation is None for a in args)
        corr = np.fromiter(
            (-2 if n else a.correlation for n, a in zip(none, args, strict=True)), np.int64, k.size
        )
        comm = (cls == COMM).tolist()
        keep = [(a or EMPTY_ARGS) if x else None for a, x in zip(args, comm, strict=True)]
        self.kernels.add(c, k, names=c.names(k), args=keep)
        self.kernel_cls.append(cls)
        self.kernel_corr.append(corr)
        ext = np.fromiter((_ext_id(a) for a in args), np.int64, k.size)
        tb_corr = np.where(corr == -2, NO_ID, corr)
        self.tb.add_kernels(c.prop(k, "tb_type"), c.ts[k], c.end(k), ext, tb_corr)

    def _add_host(self, c: _Chunk) -> None:
        """The host-side events tb-profiler may keep, in its order of the classes."""
        order = (Role.STEP, Role.ANCHOR, Role.DATA, Role.RPC, Role.RUNTIME, Role.TB)
        idx = np.concatenate([c[r] for r in order])
        idx = idx[c.prop(idx, "tb_type") != TB_NONE]
        if idx.size:
            cols = (c.prop(idx, "tb_type").tolist(), c.names(idx), c.ts[idx].tolist())
            self.tb.add_host(list(zip(*cols, c.end(idx).tolist(), c.args(idx), strict=True)))

    def _add_ops(self, c: _Chunk) -> None:
        """The per-op table's events with their roles, and the CPU span tb-profiler falls back to."""
        rpc, data = c[Role.RPC], c[Role.DATA]
        rest = [c[Role.ANCHOR], rpc[c.prop(rpc, "op_cat")], data[c.prop(data, "op_cat")]]
        idx = np.concatenate([c[Role.OP], c[Role.ISSUE], *rest])
        self.op_events.add(c, idx, names=c.names(idx), tids=self._tids(c, idx))
        sizes = [c[Role.OP].size, c[Role.ISSUE].size, sum(r.size for r in rest)]
        self.op_role.append(np.repeat(np.array([_OPS, _ISSUE, _OTHER_OP], np.int8), sizes))
        cpu = np.concatenate(
            [c[r] for r in (Role.OP, Role.ISSUE, Role.ANCHOR, Role.RPC, Role.STEP)]
        )
        cpu = cpu[~c.prop(cpu, "annotation")]
        if cpu.size:
            self.cpu_lo = min(self.cpu_lo, float(c.ts[cpu].min()))
            self.cpu_hi = max(self.cpu_hi, float(c.end(cpu).max()))

    def finish(self) -> Classified:
        parts = (self.kernels, self.steps, self.anchors, self.rpc, self.op_events, self.data)
        origin = min(min(p.first() for p in parts), self.cpu_lo, self.tb.first)
        origin = 0.0 if not np.isfinite(origin) else float(origin)
        op_events = self.op_events.ranges(origin)
        role = np.concatenate([np.empty(0, np.int8), *self.op_role])
        is_op, plain = role == _OPS, role != _OTHER_OP
        k = self.kernels.ranges(origin)
        rt = self.runtime.ranges(origin)
        corr = np.concatenate([np.empty(0, np.int64), *self.runtime_corr])
        k_corr = np.concatenate([np.empty(0, np.int64), *self.kernel_corr])
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
            kernel_cls=np.concatenate([np.empty(0, np.int8), *self.kernel_cls]),
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
            for events, ts in chunks:
                acc.add(events, ts)
        except ChunkSplitError:
            continue
        return acc.finish()
    raise AssertionError("the last pass never raises ChunkSplitError")
