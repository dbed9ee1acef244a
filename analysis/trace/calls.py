"""The per-call collective table of a traces result: one row per collective call per rank, as
numpy columns (`TracesResult.calls`, written as the Parquet `collectives` table; never in the
traces JSON, whose size it would multiply at a thousand ranks).

Times are on the job's common clock (µs after the earliest event of any rank, as every other
cross-rank figure). Per call on rank r, the k-th call of its name:

- `start_us`: first comm kernel start, else the call's own start; `end_us`: last comm kernel
  end, else the call's own end (when the collective completed on this rank: the per-rank end
  times clock-offset estimation compares);
- `latency_us` = |call ∪ its kernels|; `device_us` = |∪ kernels| (the call's own duration when it
  launched none, as on gloo/CPU);
- `transfer_us`: the k-th calls' minimum device time across the ranks that have a k-th call
  (the rank's own device time when it is the only one); `sync_us` = latency − transfer;
- `bytes`, `group_size`: 0 when unknown.

Matching is by call order per name, exactly as `collectives.combine_collectives`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["CALL_COLUMNS", "TracesResult", "call_table"]

CALL_COLUMNS = (
    "rank",
    "name",
    "call",
    "start_us",
    "end_us",
    "latency_us",
    "device_us",
    "transfer_us",
    "sync_us",
    "bytes",
    "group_size",
)


class TracesResult(dict):
    """The traces JSON (this dict, as written by --json) plus `calls`: the per-call table as
    numpy columns (CALL_COLUMNS), which only the Parquet writer reads."""

    calls: dict[str, np.ndarray]


_INT_COLUMNS = ("rank", "call", "bytes", "group_size")


def call_table(per_rank: dict[int, dict[str, dict[str, Any]]]) -> dict[str, np.ndarray]:
    """Columns (CALL_COLUMNS) of every call of every rank, by name (first seen), then rank."""
    ranks = sorted(per_rank)
    names = list(dict.fromkeys(n for r in ranks for n in per_rank[r]))
    pieces: dict[str, list[np.ndarray]] = {c: [] for c in CALL_COLUMNS}
    for name in names:
        have = [r for r in ranks if name in per_rank[r]]
        inst = [per_rank[r][name] for r in have]
        m = min(x["device_us"].size for x in inst)
        transfer = np.vstack([x["device_us"][:m] for x in inst]).min(axis=0)
        for r, x in zip(have, inst, strict=True):
            n = int(x["device_us"].size)
            call_transfer = np.concatenate([transfer, x["device_us"][m:]])
            end = x.get("end_us")
            cols = {
                "rank": np.full(n, r),
                "name": np.full(n, name, dtype=object),
                "call": np.arange(n),
                "end_us": end if end is not None else np.full(n, np.nan),
                "transfer_us": call_transfer,
                "sync_us": x["latency_us"] - call_transfer,
            }
            for c in CALL_COLUMNS:
                pieces[c].append(cols[c] if c in cols else x[c])
    return {
        c: np.concatenate(v) if v else np.empty(0, np.int64 if c in _INT_COLUMNS else float)
        for c, v in pieces.items()
    }
