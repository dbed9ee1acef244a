"""Collective calls: per-rank instances (size, latency, device time, exposed time, phase); the
cross-rank tables are analysis.trace.crossrank's.

An instance is one CPU-side collective annotation (`nccl:all_reduce`, `gloo:broadcast`, ...) with
the GPU comm kernels it launched. A comm kernel that no annotation launched becomes an instance of
its own, named from the kernel (`ncclKernel_AllReduce_...` -> `nccl:all_reduce`), unless it is
an orphan (no launch in the trace, see attribution.py): an orphan is linked to an annotation only
through that annotation's External id, and never becomes a call of its own.

An annotation issued by a c10d op is named and sized from that op (analysis.trace.c10d: what the
program asked for, e.g. `gloo:reduce_scatter`), with the annotation as its `algorithm` (what ran,
e.g. `gloo:all_reduce`), whose bus factor the busbw uses, and the loop phase it was issued in;
each collective row splits its calls by phase (`phases`: FSDP's forward and backward all-gathers)
with the exposed part of each call (its transfer not hidden under computation).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from analysis.trace.c10d import Issued, algorithm_of, issued_calls
from analysis.trace.classify import COMM, Classified
from analysis.trace.intervals import Intervals, covered_us, merge, total_us
from profiler.runfolder.layout import bus_factor  # comm.csv's bus model: one set of factors

__all__ = ["DTYPE_BYTES", "bus_factor", "rank_instances"]

# Element sizes for record_param_comms' `dtype` and for `Input type` strings.
DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "int": 4,
    "int32": 4,
    "uint32": 4,
    "double": 8,
    "float64": 8,
    "long": 8,
    "long int": 8,
    "int64": 8,
    "uint64": 8,
    "half": 2,
    "c10::half": 2,
    "float16": 2,
    "bfloat16": 2,
    "c10::bfloat16": 2,
    "short": 2,
    "int16": 2,
    "byte": 1,
    "char": 1,
    "bool": 1,
    "unsigned char": 1,
    "signed char": 1,
    "int8": 1,
    "uint8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complexfloat": 8,
    "complexdouble": 16,
}
_KERNEL_OP_RE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")


def _nbytes_from_dims(dims: list | None, types: list | None) -> int | None:
    """Σ prod(shape) × element size over the tensor inputs of an op (tb-profiler's rule)."""
    if not dims or not types:
        return None
    total, known = 0, False
    for shape, typ in zip(dims, types, strict=False):
        size = DTYPE_BYTES.get(str(typ).lower())
        while isinstance(shape, list) and shape and isinstance(shape[0], list):
            shape = shape[0]  # a TensorList's first tensor: DDP buckets are one flat tensor each
        if size is None or not isinstance(shape, list) or not shape:
            continue
        total += math.prod(int(x) for x in shape) * size
        known = True
    return total if known else None


def _nbytes_from_counts(args, name: str) -> int | None:
    size = DTYPE_BYTES.get(str(args.dtype).lower()) if args.dtype else None
    if size is None:
        return None
    # nccl-tests sizes all-gather by its output; every other collective by its input.
    nelems = args.out_nelems if "gather" in name and args.out_nelems else args.in_nelems
    return nelems * size if nelems is not None else None


def _containing(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the interval (sorted by start) that contains each time t, else -1."""
    idx = np.searchsorted(starts, t, side="right") - 1
    ok = (idx >= 0) & (ends[np.clip(idx, 0, None)] >= t)
    return np.where(ok, idx, -1)


def _link_kernels(c: Classified, comm_idx: np.ndarray) -> np.ndarray:
    """Anchor index of each comm kernel: the annotation on the launching thread that contains the
    launch (correlation id), else the annotation or record_param_comms with its External id."""
    anchors = c.anchors
    link = np.full(comm_idx.size, -1, dtype=np.int64)
    a_tids = anchors.tids
    for tid in np.unique(anchors.tids).tolist():
        on_tid = np.flatnonzero(a_tids == tid)
        sel = np.flatnonzero(c.launch_tid[comm_idx] == tid)
        if sel.size:
            hit = _containing(
                anchors.start[on_tid], anchors.end[on_tid], c.launch_us[comm_idx[sel]]
            )
            link[sel] = np.where(hit >= 0, on_tid[np.clip(hit, 0, None)], -1)
    if (link < 0).any():
        by_ext = {a.external_id: i for i, a in enumerate(anchors.args) if a.external_id is not None}
        for i, r_args in enumerate(c.rpc.args):  # rpc wraps (or sits in) one annotation
            on_tid = np.flatnonzero(a_tids == c.rpc.tids[i])
            if r_args.external_id is not None and on_tid.size:
                inside = on_tid[
                    (anchors.start[on_tid] >= c.rpc.start[i])
                    & (anchors.start[on_tid] <= c.rpc.end[i])
                ]
                if inside.size:
                    by_ext.setdefault(r_args.external_id, int(inside[0]))
        for j in np.flatnonzero(link < 0):
            a = c.kernels.args[comm_idx[j]]
            link[j] = by_ext.get(a.external_id, by_ext.get(a.external_id_lc, -1))
    return link


def _anchor_sizes(c: Classified) -> tuple[list[int | None], list[int | None]]:
    """Bytes and group size of each anchor: from the record_param_comms op that contains the call
    (or that the call contains) on the same thread, else the call's Input Dims × dtype."""
    anchors, rpc = c.anchors, c.rpc
    rpc_of = np.full(len(anchors), -1, dtype=np.int64)
    a_tids, r_tids = anchors.tids, rpc.tids
    for tid in np.intersect1d(rpc.tids, anchors.tids).tolist():
        on_r, on_a = np.flatnonzero(r_tids == tid), np.flatnonzero(a_tids == tid)
        order = on_r[np.argsort(rpc.start[on_r], kind="stable")]
        rs, re_ = rpc.start[order], rpc.end[order]
        a_s, a_e = anchors.start[on_a], anchors.end[on_a]
        outer = _containing(rs, re_, a_s)
        inner = np.searchsorted(rs, a_s, side="left")
        inner_ok = (inner < rs.size) & (rs[np.clip(inner, 0, rs.size - 1)] <= a_e)
        pick = np.where(outer >= 0, outer, np.where(inner_ok, inner, -1))
        rpc_of[on_a] = np.where(pick >= 0, order[np.clip(pick, 0, None)], -1)
    nbytes: list[int | None] = []
    group: list[int | None] = []
    for i, j in enumerate(rpc_of.tolist()):  # one row per collective call, not per event
        r_args = rpc.args[j] if j >= 0 else None
        size = _nbytes_from_counts(r_args, anchors.names[i]) if r_args else None
        if size is None:
            a = anchors.args[i]
            size = _nbytes_from_dims(a.input_dims, a.input_type)
        nbytes.append(size)
        group.append(r_args.group_size if r_args else None)
    return nbytes, group


@dataclass(frozen=True, slots=True, kw_only=True)
class _Call:
    """One collective call on one rank (the fields `rank_instances` groups by name)."""

    name: str
    algorithm: str
    """What moved the bytes: the annotation's name (= `name` unless a c10d op renamed it)."""
    phase: int
    """analysis.trace.c10d.PHASE_CODES of the loop phase it was issued in (0: unknown)."""
    start_us: float
    """First comm kernel start, else the call's start (µs rel. to the trace origin)."""
    end_us: float
    """Last comm kernel end, else the call's end (µs rel. to the trace origin): the instant the
    collective completed on this rank, which the clock alignment compares across ranks."""
    latency_us: float
    """|call ∪ its kernels|."""
    device_us: float
    """|∪ kernels|, or the call's own duration when it launched none (gloo/CPU)."""
    exposed_us: float
    """The part of device_us no computation overlaps."""
    nbytes: int
    """0 when unknown."""
    group_size: int
    """0 when unknown."""
    starts: np.ndarray
    ends: np.ndarray
    """The call's and its kernels' intervals, for the per-name union of latencies."""


def _kernel_name(name: str) -> str:
    m = _KERNEL_OP_RE.search(name)
    op = re.sub(r"(?<!^)(?=[A-Z])", "_", m.group(1)).lower() if m else "kernel"
    return f"nccl:{op}"


def rank_instances(
    c: Classified, lo: float, hi: float, compute: Intervals | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """Collective instances whose call starts in [lo, hi] (µs rel. to origin), grouped by name.

    Per instance: `start_us` (first comm kernel start, else the call's start; rel. to origin),
    `end_us` (last comm kernel end, else the call's end; rel. to origin),
    `latency_us` = |call ∪ its kernels|, `device_us` = |∪ kernels| (the call's own duration when it
    launched none, as on gloo/CPU), `exposed_us` = the part of device_us that `compute` (merged
    computation intervals; none: nothing hides it) does not overlap, `bytes` (0 when unknown),
    `group_size` (0 when unknown), `phase` (analysis.trace.c10d.PHASE_CODES), all arrays in call
    order; plus `union_us`, the length of the union of those latencies (tb-profiler's "total
    latency": time with at least one such call in flight) and `algorithm`, the annotation that
    moved the bytes (analysis.trace.c10d).
    """
    comm_idx = np.flatnonzero(c.kernel_cls == COMM)
    link = (
        _link_kernels(c, comm_idx)
        if comm_idx.size and len(c.anchors)
        else np.full(comm_idx.size, -1, dtype=np.int64)
    )
    by_anchor: dict[int, list[int]] = defaultdict(list)
    for j, anchor in enumerate(link.tolist()):
        by_anchor[anchor].append(int(comm_idx[j]))
    hidden = compute if compute is not None else (np.empty(0), np.empty(0))
    rows = _anchor_calls(c, lo, hi, by_anchor, hidden)
    # An orphan kernel (attribution.py) never becomes a call: its launch is not in the trace.
    rows += [
        _kernel_call(c, k, hidden)
        for k in by_anchor.get(-1, [])
        if lo <= c.launch_us[k] <= hi and not c.orphan[k]
    ]
    rows.sort(key=lambda r: r.start_us)
    return {name: _instances([r for r in rows if r.name == name]) for name in _names(rows)}


def _exposed_us(device: Intervals, compute: Intervals) -> float:
    """|device ∖ compute| for one call's (merged) device intervals."""
    return float(total_us(device) - covered_us(compute, *device).sum())


def _names(rows: list[_Call]) -> list[str]:
    return list(dict.fromkeys(r.name for r in rows))


def _anchor_calls(
    c: Classified, lo: float, hi: float, by_anchor: dict[int, list[int]], compute: Intervals
) -> list[_Call]:
    """One _Call per collective annotation starting in [lo, hi], with the comm kernels linked
    to it (`by_anchor`: annotation index -> kernel indices), named from its c10d op if any."""
    nbytes, group = _anchor_sizes(c)
    issued = issued_calls(c)
    a = c.anchors
    rows: list[_Call] = []
    for i in range(len(a)):
        if not lo <= a.start[i] <= hi:
            continue
        ks = by_anchor.get(i, [])
        ks_s, ks_e = c.kernels.start[ks], c.kernels.end[ks]
        s = np.append(ks_s, a.start[i])
        e = np.append(ks_e, a.end[i])
        if len(ks) <= 1:  # the common case, in closed form: |call ∪ kernel|
            device = float(ks_e.sum() - ks_s.sum()) if ks else a.end[i] - a.start[i]
            hidden = max(0.0, min(e.min(), e.max()) - max(s.min(), s.max())) if ks else 0.0
            latency = float((e - s).sum()) - hidden
        else:
            latency = total_us(merge(s, e))
            device = total_us(merge(ks_s, ks_e))
        for ka in (c.kernels.args[k] for k in ks):  # size from the kernel when the call lacks it
            nbytes[i] = nbytes[i] or _nbytes_from_counts(ka, a.names[i])
            group[i] = group[i] or ka.group_size
        on_device = merge(ks_s, ks_e) if ks else (a.start[i : i + 1], a.end[i : i + 1])
        name, size, phase = _named(a.names[i], issued[i], nbytes[i])
        rows.append(
            _Call(
                name=name,
                algorithm=a.names[i],
                phase=phase,
                start_us=float(ks_s.min()) if ks else float(a.start[i]),
                end_us=float(ks_e.max()) if ks else float(a.end[i]),
                latency_us=latency,
                device_us=device,
                exposed_us=_exposed_us(on_device, compute),
                nbytes=size or 0,
                group_size=group[i] or 0,
                starts=s,
                ends=e,
            )
        )
    return rows


def _named(anchor: str, issued: Issued | None, nbytes: int | None) -> tuple[str, int | None, int]:
    """(name, bytes, phase) of a call: sized from its c10d op when one issued it, and named from
    it where the backend ran another algorithm (analysis.trace.c10d); else the annotation's own."""
    if issued is None:
        return anchor, nbytes, 0
    name = anchor
    if algorithm_of(anchor) != issued.collective:  # gloo's reduce-scatter, run as an all-reduce
        name = f"{anchor.split(':', 1)[0]}:{issued.collective}"
    return name, issued.nbytes or nbytes, issued.phase


def _kernel_call(c: Classified, k: int, compute: Intervals) -> _Call:
    """A comm kernel no annotation claims: a call of its own, named from the kernel."""
    ks, ke = c.kernels.start[k], c.kernels.end[k]
    ka = c.kernels.args[k]
    name = _kernel_name(c.kernels.names[k])
    return _Call(
        name=name,
        algorithm=name,
        phase=0,
        start_us=float(ks),
        end_us=float(ke),
        latency_us=ke - ks,
        device_us=ke - ks,
        exposed_us=_exposed_us((np.array([ks]), np.array([ke])), compute),
        nbytes=_nbytes_from_counts(ka, name) or 0,
        group_size=ka.group_size or 0,
        starts=np.array([ks]),
        ends=np.array([ke]),
    )


def _instances(mine: list[_Call]) -> dict[str, np.ndarray]:
    """The columns `rank_instances` returns for one name's calls (in call order)."""
    return {
        "start_us": np.array([r.start_us for r in mine]),
        "end_us": np.array([r.end_us for r in mine]),
        "latency_us": np.array([r.latency_us for r in mine]),
        "device_us": np.array([r.device_us for r in mine]),
        "exposed_us": np.array([r.exposed_us for r in mine]),
        "bytes": np.array([r.nbytes for r in mine], dtype=np.int64),
        "group_size": np.array([r.group_size for r in mine], dtype=np.int64),
        "phase": np.array([r.phase for r in mine], dtype=np.int64),
        "algorithm": mine[0].algorithm,  # one per name: a c10d op runs as one algorithm
        "union_us": total_us(
            merge(np.concatenate([r.starts for r in mine]), np.concatenate([r.ends for r in mine]))
        ),
    }
