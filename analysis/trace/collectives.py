"""Collective calls: per-rank instances (size, latency, device time) and the cross-rank tables
(transfer vs sync time, algbw/busbw, start skew per rank).

An instance is one CPU-side collective annotation (`nccl:all_reduce`, `gloo:broadcast`, ...) with
the GPU comm kernels it launched. A comm kernel that no annotation launched becomes an instance of
its own, named from the kernel (`ncclKernel_AllReduce_...` -> `nccl:all_reduce`), unless it is
an orphan (no launch in the trace, see attribution.py): an orphan is linked to an annotation only
through that annotation's External id, and never becomes a call of its own.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

import numpy as np

from analysis.trace.classify import COMM, Classified
from analysis.trace.events import decode_list
from analysis.trace.intervals import merge, total_us
from profiler.runfolder.layout import bus_factor  # comm.csv's bus model: one set of factors

__all__ = ["DTYPE_BYTES", "bus_factor", "combine_collectives", "rank_instances"]

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


def rank_instances(c: Classified, lo: float, hi: float) -> dict[str, dict[str, np.ndarray]]:
    """Collective instances whose call starts in [lo, hi] (µs rel. to origin), grouped by name.

    Per instance: `start_us` (first comm kernel start, else the call's start; rel. to origin),
    `end_us` (last comm kernel end, else the call's end; rel. to origin: when the collective
    completed on this rank),
    `latency_us` = |call ∪ its kernels|, `device_us` = |∪ kernels| (the call's own duration when it
    launched none, as on gloo/CPU), `bytes` (0 when unknown), `group_size` (0 when unknown),
    all arrays in call order; plus `union_us`, the length of the union of those latencies
    (tb-profiler's "total latency": time with at least one such call in flight).
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
    order = np.argsort(calls["start_us"], kind="stable")  # call order: by start
    names = np.asarray(calls["name"], dtype=object)[order]
    out = {}
    for name in dict.fromkeys(names.tolist()):
        mine = order[names == name]
        cols = {k: calls[k][mine] for k in _CALL_KEYS}
        on = np.isin(calls["iv_call"], mine)
        cols["union_us"] = total_us(merge(calls["iv_start"][on], calls["iv_end"][on]))
        out[name] = cols
    return out


_CALL_KEYS = ("start_us", "end_us", "latency_us", "device_us", "bytes", "group_size")


def _concat(a: dict, b: dict) -> dict:
    """Two call tables as one (b's calls after a's; b's interval call ids shifted)."""
    n = len(a["name"])
    out = {k: np.concatenate([a[k], b[k]]) for k in (*_CALL_KEYS, "iv_start", "iv_end")}
    out["iv_call"] = np.concatenate([a["iv_call"], b["iv_call"] + n])
    out["name"] = [*a["name"], *b["name"]]
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
    return {
        "name": [a.names[i] for i in idx.tolist()],
        "start_us": start,
        "end_us": end,
        "latency_us": latency,
        "device_us": device,
        "bytes": np.array([nbytes[i] or 0 for i in idx.tolist()], dtype=np.int64),
        "group_size": np.array([group[i] or 0 for i in idx.tolist()], dtype=np.int64),
        "iv_start": np.concatenate([a_s, k.start[flat]]),
        "iv_end": np.concatenate([a_e, k.end[flat]]),
        "iv_call": np.concatenate([np.arange(idx.size), np.repeat(np.arange(idx.size), per)]),
    }


def _kernel_calls(c: Classified, own: np.ndarray) -> dict[str, Any]:
    """Comm kernels no annotation claims: each a call of its own, named from the kernel."""
    k = c.kernels
    ks, ke = k.start[own], k.end[own]
    names = [_kernel_name(k.names[x]) for x in own.tolist()]
    args = [k.args[x] for x in own.tolist()]
    return {
        "name": names,
        "start_us": ks,
        "end_us": ke,
        "latency_us": ke - ks,
        "device_us": ke - ks,
        "bytes": np.array(
            [_nbytes_from_counts(ka, n) or 0 for ka, n in zip(args, names, strict=True)],
            dtype=np.int64,
        ),
        "group_size": np.array([ka.group_size or 0 for ka in args], dtype=np.int64),
        "iv_start": ks,
        "iv_end": ke,
        "iv_call": np.arange(own.size),
    }


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def combine_collectives(per_rank: dict[int, dict[str, dict]], world_size: int) -> dict:
    """Cross-rank collective tables from each rank's `rank_instances` (start_us already aligned).

    Instances are matched in call order per name (k-th call on every rank). The transfer time of a
    matched instance is the minimum device time across ranks; the rest of each rank's latency is
    synchronisation/wait. Returns {collectives, collectives_per_rank, stragglers}.
    """
    ranks = sorted(per_rank)
    names = list(dict.fromkeys(n for r in ranks for n in per_rank[r]))
    collectives, per_rank_rows = [], []
    skews: dict[int, list[np.ndarray]] = defaultdict(list)
    last: dict[int, int] = defaultdict(int)
    matched_total = 0
    for name in names:
        have = [r for r in ranks if name in per_rank[r]]
        inst = [per_rank[r][name] for r in have]
        m = min(x["device_us"].size for x in inst)
        dev = np.vstack([x["device_us"][:m] for x in inst])
        transfer = dev.min(axis=0)  # per matched instance, µs
        if len(have) > 1 and m:
            starts = np.vstack([x["start_us"][:m] for x in inst])
            skew = starts - starts.min(axis=0)
            arrived_last = np.bincount(starts.argmax(axis=0), minlength=len(have))
            for row, r in enumerate(have):
                skews[r].append(skew[row])
                last[r] += int(arrived_last[row])
            matched_total += m
        rows = [_rank_row(r, name, x, transfer, m) for r, x in zip(have, inst, strict=True)]
        per_rank_rows += rows
        collectives.append(_collective_row(name, inst, rows, transfer, m, world_size))
    return {
        "collectives": collectives,
        "collectives_per_rank": per_rank_rows,
        "stragglers": [_straggler(r, skews[r], last[r], matched_total) for r in ranks],
    }


def _rank_row(r: int, name: str, x: dict, transfer: np.ndarray, m: int) -> dict:
    """One rank's `collectives_per_rank` row for `name` (its instances `x`)."""
    # Per call: transfer = the matched calls' cross-rank minimum device time (a call beyond the
    # shortest rank's count is its own transfer); sync = latency − transfer, never negative since
    # a call's latency covers its own device time. Totals are sums over calls, so latency =
    # transfer + sync holds per call and in total.
    call_transfer = np.concatenate([transfer, x["device_us"][m:]])
    call_sync = x["latency_us"] - call_transfer
    return {
        "rank": r,
        "name": name,
        "calls": int(x["device_us"].size),
        "bytes_total": int(x["bytes"].sum()),
        "latency_us_total": float(x["latency_us"].sum()),
        "transfer_us_total": float(call_transfer.sum()),
        "sync_us_total": float(call_sync.sum()),
        "latency_us_union": float(x["union_us"]),
    }


def _collective_row(
    name: str, inst: list[dict], rows: list[dict], transfer: np.ndarray, m: int, world_size: int
) -> dict:
    """The `collectives` row of `name`: per-rank totals averaged, bandwidths over matched calls."""
    sized = inst[0]["bytes"][:m] > 0
    moved = float(inst[0]["bytes"][:m][sized].sum())
    moved_us = float(transfer[sized].sum())
    algbw = moved / moved_us / 1e3 if moved_us > 0 else None  # bytes/µs -> GB/s (1e9 B)
    groups = np.concatenate([x["group_size"] for x in inst])
    n = int(groups.max()) if groups.size and groups.max() > 0 else world_size
    factor = bus_factor(name, n)
    calls = _mean([x["calls"] for x in rows])
    latency = _mean([x["latency_us_total"] for x in rows])
    return {
        "name": name,
        "calls": round(calls),
        "ranks": len(inst),
        "group_size": n,
        "bytes_total": _mean([x["bytes_total"] for x in rows]),
        "bytes_avg": _mean([x["bytes_total"] for x in rows]) / calls if calls else 0.0,
        "latency_us_total": latency,
        "latency_us_avg": latency / calls if calls else 0.0,
        "transfer_us_total": _mean([x["transfer_us_total"] for x in rows]),
        "sync_us_total": _mean([x["sync_us_total"] for x in rows]),
        "latency_us_union": _mean([x["latency_us_union"] for x in rows]),
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * factor if algbw is not None and factor is not None else None,
    }


def _straggler(r: int, skews: list[np.ndarray], last: int, matched_total: int) -> dict:
    """Rank `r`'s start skew over its matched calls and how often it arrived last."""
    s = np.concatenate(skews) if skews else np.empty(0)
    return {
        "rank": r,
        "matched_calls": int(s.size),
        "start_skew_us_mean": float(s.mean()) if s.size else None,
        "start_skew_us_max": float(s.max()) if s.size else None,
        "straggler_score": last / matched_total if matched_total else None,
    }
