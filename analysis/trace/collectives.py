"""Collective calls: per-rank instances (size, latency, device time, exposed time, phase); the
cross-rank tables are analysis.trace.crossrank's.

An instance is one CPU-side collective annotation (`nccl:all_reduce`, `gloo:broadcast`, ...) with
the GPU comm kernels it launched. A comm kernel that no annotation launched becomes an instance of
its own, named from the kernel (`ncclKernel_AllReduce_...` -> `nccl:all_reduce`), unless it is
an orphan (no launch in the trace, see attribution.py): an orphan is linked to an annotation only
through that annotation's External id, and never becomes a call of its own.

An annotation issued by a c10d op is sized from that op (analysis.trace.c10d: what the program
asked for) and named from it where the backend ran another algorithm (gloo runs a reduce-scatter
as `gloo:all_reduce`: the call is `gloo:reduce_scatter`); the annotation is its `algorithm`, whose
bus factor the busbw uses, and the loop phase it was issued in is its `phase`. Each call's
`exposed_us` is the part of its transfer no computation overlaps.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

import numpy as np

from analysis.trace.c10d import algorithm_of, issued_calls
from analysis.trace.classify import COMM, Classified
from analysis.trace.events import decode_list
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
            size = _nbytes_from_dims(decode_list(a.input_dims), decode_list(a.input_type))
        nbytes.append(size)
        group.append(r_args.group_size if r_args else None)
    return nbytes, group


def _kernel_name(name: str) -> str:
    m = _KERNEL_OP_RE.search(name)
    op = re.sub(r"(?<!^)(?=[A-Z])", "_", m.group(1)).lower() if m else "kernel"
    return f"nccl:{op}"


def rank_instances(
    c: Classified, lo: float, hi: float, compute: Intervals | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """Collective instances whose call starts in [lo, hi] (µs rel. to origin), grouped by name.

    Per instance: `start_us` (first comm kernel start, else the call's start; rel. to origin),
    `end_us` (last comm kernel end, else the call's end; rel. to origin: when the collective
    completed on this rank),
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
    calls = _anchor_calls(c, lo, hi, by_anchor)
    # An orphan kernel (attribution.py) never becomes a call: its launch is not in the trace.
    own = [k for k in by_anchor.get(-1, []) if lo <= c.launch_us[k] <= hi and not c.orphan[k]]
    calls = _concat(calls, _kernel_calls(c, np.array(own, dtype=np.int64)))
    hidden = compute if compute is not None else (np.empty(0), np.empty(0))
    calls["exposed_us"] = _exposed_us(calls, hidden)
    order = np.argsort(calls["start_us"], kind="stable")  # call order: by start
    names = np.asarray(calls["name"], dtype=object)[order]
    out = {}
    for name in dict.fromkeys(names.tolist()):
        mine = order[names == name]
        cols = {k: calls[k][mine] for k in (*_CALL_KEYS, "exposed_us")}
        on = np.isin(calls["iv_call"], mine)
        cols["union_us"] = total_us(merge(calls["iv_start"][on], calls["iv_end"][on]))
        cols["algorithm"] = calls["algorithm"][int(mine[0])]  # one per name
        out[name] = cols
    return out


_CALL_KEYS = ("start_us", "end_us", "latency_us", "device_us", "bytes", "group_size", "phase")


def _exposed_us(calls: dict, compute: Intervals) -> np.ndarray:
    """Per call, |its device intervals ∖ compute|: the comm kernels (`dv_*`, by `dv_call`), or
    the call's own range when it launched none."""
    dev = np.zeros(len(calls["name"]))
    covered = covered_us(compute, calls["dv_start"], calls["dv_end"])
    spans = calls["dv_end"] - calls["dv_start"]
    np.add.at(dev, calls["dv_call"], spans - covered)
    return np.maximum(dev, 0.0)


def _concat(a: dict, b: dict) -> dict:
    """Two call tables as one (b's calls after a's; b's interval call ids shifted)."""
    n = len(a["name"])
    keys = (*_CALL_KEYS, "iv_start", "iv_end", "dv_start", "dv_end")
    out = {k: np.concatenate([a[k], b[k]]) for k in keys}
    out["iv_call"] = np.concatenate([a["iv_call"], b["iv_call"] + n])
    out["dv_call"] = np.concatenate([a["dv_call"], b["dv_call"] + n])
    out["name"] = [*a["name"], *b["name"]]
    out["algorithm"] = [*a["algorithm"], *b["algorithm"]]
    return out


def _anchor_calls(
    c: Classified, lo: float, hi: float, by_anchor: dict[int, list[int]]
) -> dict[str, Any]:
    """The calls of the collective annotations starting in [lo, hi], with the comm kernels linked
    to them (`by_anchor`: annotation index -> kernel indices), as columns; `iv_*`: every call's
    intervals (call and kernels), for the per-name union."""
    nbytes, group = _anchor_sizes(c)
    a, k = c.anchors, c.kernels
    idx = np.flatnonzero((lo <= a.start) & (a.start <= hi))
    ks_of = [by_anchor.get(i, []) for i in idx.tolist()]
    a_s, a_e = a.start[idx], a.end[idx]
    start, end = a_s.copy(), a_e.copy()
    device = a_e - a_s  # launched no kernel: the call's own duration (gloo/CPU)
    latency = device - 0.0
    one = np.array([len(x) == 1 for x in ks_of], dtype=bool)
    k1 = np.array([x[0] for x in ks_of if len(x) == 1], dtype=np.int64)
    ks, ke = k.start[k1], k.end[k1]  # the common case in closed form: |call ∪ kernel|
    hidden = np.maximum(0.0, np.minimum(ke, a_e[one]) - np.maximum(ks, a_s[one]))
    latency[one] = ((ke - ks) + (a_e[one] - a_s[one])) - hidden
    device[one], start[one], end[one] = ke - ks, ks, ke
    for j in np.flatnonzero([len(x) > 1 for x in ks_of]).tolist():
        s_, e_ = k.start[ks_of[j]], k.end[ks_of[j]]
        latency[j] = total_us(merge(np.append(s_, a_s[j]), np.append(e_, a_e[j])))
        device[j] = total_us(merge(s_, e_))
        start[j], end[j] = float(s_.min()), float(e_.max())
    for i, ks_i in zip(idx.tolist(), ks_of, strict=True):  # size from a kernel the call lacks
        for ka in (k.args[x] for x in ks_i):
            nbytes[i] = nbytes[i] or _nbytes_from_counts(ka, a.names[i])
            group[i] = group[i] or ka.group_size
    flat = np.array([x for ks_i in ks_of for x in ks_i], dtype=np.int64)
    per = np.array([len(x) for x in ks_of], dtype=np.int64)
    issued = issued_calls(c)
    named = [_named(a.names[i], issued[i], nbytes[i]) for i in idx.tolist()]
    bare = np.flatnonzero(per == 0)  # launched no kernel: the call's range is its device time
    return {
        "name": [n for n, _, _ in named],
        "algorithm": [a.names[i] for i in idx.tolist()],
        "start_us": start,
        "end_us": end,
        "latency_us": latency,
        "device_us": device,
        "bytes": np.array([size or 0 for _, size, _ in named], dtype=np.int64),
        "group_size": np.array([group[i] or 0 for i in idx.tolist()], dtype=np.int64),
        "phase": np.array([phase for _, _, phase in named], dtype=np.int64),
        "iv_start": np.concatenate([a_s, k.start[flat]]),
        "iv_end": np.concatenate([a_e, k.end[flat]]),
        "iv_call": np.concatenate([np.arange(idx.size), np.repeat(np.arange(idx.size), per)]),
        "dv_start": np.concatenate([a_s[bare], k.start[flat]]),
        "dv_end": np.concatenate([a_e[bare], k.end[flat]]),
        "dv_call": np.concatenate([bare, np.repeat(np.arange(idx.size), per)]),
    }


def _named(anchor: str, issued, nbytes: int | None) -> tuple[str, int | None, int]:  # noqa: ANN001
    """(name, bytes, phase) of a call: sized from its c10d op when one issued it, and named from
    it where the backend ran another algorithm (analysis.trace.c10d); else the annotation's own."""
    if issued is None:
        return anchor, nbytes, 0
    name = anchor
    if algorithm_of(anchor) != issued.collective:  # gloo's reduce-scatter, run as an all-reduce
        name = f"{anchor.split(':', 1)[0]}:{issued.collective}"
    return name, issued.nbytes or nbytes, issued.phase


def _kernel_calls(c: Classified, own: np.ndarray) -> dict[str, Any]:
    """Comm kernels no annotation claims: each a call of its own, named from the kernel."""
    k = c.kernels
    ks, ke = k.start[own], k.end[own]
    names = [_kernel_name(k.names[x]) for x in own.tolist()]
    args = [k.args[x] for x in own.tolist()]
    return {
        "name": names,
        "algorithm": list(names),
        "start_us": ks,
        "end_us": ke,
        "latency_us": ke - ks,
        "device_us": ke - ks,
        "phase": np.zeros(own.size, dtype=np.int64),
        "bytes": np.array(
            [_nbytes_from_counts(ka, n) or 0 for ka, n in zip(args, names, strict=True)],
            dtype=np.int64,
        ),
        "group_size": np.array([ka.group_size or 0 for ka in args], dtype=np.int64),
        "iv_start": ks,
        "iv_end": ke,
        "iv_call": np.arange(own.size),
        "dv_start": ks,
        "dv_end": ke,
        "dv_call": np.arange(own.size),
    }
