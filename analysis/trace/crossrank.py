"""Cross-rank collective tables from each rank's collective instances
(analysis.trace.collectives.rank_instances): transfer vs sync time, algbw/busbw with the bus
factor of the algorithm that moved the bytes, the split by loop phase, and the start skew per
rank (docs/reference/metrics.md §5 and §6).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from analysis.trace.c10d import phase_name
from profiler.runfolder.layout import bus_factor

__all__ = ["combine_collectives"]


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
    """The `collectives` row of `name`: per-rank totals averaged, bandwidths over matched calls
    (busbw with the bus factor of the algorithm that moved the bytes), split by loop phase."""
    groups = np.concatenate([x["group_size"] for x in inst])
    n = int(groups.max()) if groups.size and groups.max() > 0 else world_size
    algorithm = str(inst[0].get("algorithm", "") or "") or name  # a str (a 0-d array once copied)
    factor = bus_factor(algorithm, n)
    algbw = _algbw(inst[0]["bytes"][:m], transfer)
    calls = _mean([x["calls"] for x in rows])
    latency = _mean([x["latency_us_total"] for x in rows])
    return {
        "name": name,
        "algorithm": algorithm,
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
        "exposed_us_total": _mean(
            [float(x["exposed_us"].sum()) for x in inst if "exposed_us" in x]
        ),
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * factor if algbw is not None and factor is not None else None,
        "phases": _phase_rows(inst, transfer, m, factor),
    }


def _algbw(nbytes: np.ndarray, transfer: np.ndarray) -> float | None:
    """Bytes ÷ transfer time over the sized calls, GB/s (1e9 B); None without any."""
    sized = nbytes > 0
    moved, moved_us = float(nbytes[sized].sum()), float(transfer[sized].sum())
    return moved / moved_us / 1e3 if moved_us > 0 else None  # bytes/µs -> GB/s


def _phase_rows(inst: list[dict], transfer: np.ndarray, m: int, factor: float | None) -> list:
    """One row per loop phase the calls were issued in (analysis.trace.c10d; none: []): calls,
    bytes, latency, exposed and overlapped time per rank (means over ranks, per analysed window),
    the exposed part that was transfer rather than waiting for a later rank (each call's exposed
    time capped at its transfer time) and the bandwidths of its matched calls."""
    if any("phase" not in x for x in inst) or not inst[0]["phase"].any():
        return []
    out = []
    for code in np.unique(inst[0]["phase"]).tolist():
        mine = [x["phase"] == code for x in inst]
        device = _mean([float(x["device_us"][k].sum()) for x, k in zip(inst, mine, strict=True)])
        exposed = _mean([float(x["exposed_us"][k].sum()) for x, k in zip(inst, mine, strict=True)])
        moving = _mean([float(np.minimum(x["exposed_us"], np.concatenate([transfer, x["device_us"][m:]]))[k].sum())
                        for x, k in zip(inst, mine, strict=True)])  # fmt: skip
        matched = mine[0][:m]
        algbw = _algbw(inst[0]["bytes"][:m][matched], transfer[matched])
        calls = _mean([float(k.sum()) for k in mine])
        nbytes = _mean([float(x["bytes"][k].sum()) for x, k in zip(inst, mine, strict=True)])
        out.append(
            {
                "phase": phase_name(code),
                "calls": round(calls),
                "bytes_total": nbytes,
                "bytes_avg": nbytes / calls if calls else 0.0,
                "latency_us_total": _mean([float(x["latency_us"][k].sum()) for x, k in zip(inst, mine, strict=True)]),
                "exposed_us_total": exposed,
                "exposed_transfer_us_total": moving,
                "overlapped_us_total": max(0.0, device - exposed),
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * factor if algbw is not None and factor is not None else None,
            }
        )  # fmt: skip
    return out


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
