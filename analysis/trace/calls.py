"""The per-call collective table of a traces result: one row per collective call per rank, as
columns (the traces JSON's `calls`, the Parquet `collectives` table, docs/reference/schemas.md).

Times are on the job's common clock (µs after the earliest event of any rank, as every other
cross-rank figure). Per call on rank r, the k-th call of its name:

- `start_us`: first comm kernel start, else the call's own start; `end_us`: the last end of the
  call and its kernels (per-rank end times, which clock-offset estimation needs);
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

__all__ = ["CALL_COLUMNS", "call_table"]

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


def call_table(per_rank: dict[int, dict[str, dict[str, Any]]]) -> dict[str, list]:
    """Columns (CALL_COLUMNS) of every call of every rank, by name (first seen), then rank."""
    ranks = sorted(per_rank)
    names = list(dict.fromkeys(n for r in ranks for n in per_rank[r]))
    cols: dict[str, list] = {c: [] for c in CALL_COLUMNS}
    for name in names:
        have = [r for r in ranks if name in per_rank[r]]
        inst = [per_rank[r][name] for r in have]
        m = min(x["device_us"].size for x in inst)
        transfer = np.vstack([x["device_us"][:m] for x in inst]).min(axis=0)
        for r, x in zip(have, inst, strict=True):
            n = int(x["device_us"].size)
            call_transfer = np.concatenate([transfer, x["device_us"][m:]])
            end = x.get("end_us")
            cols["rank"] += [r] * n
            cols["name"] += [name] * n
            cols["call"] += list(range(n))
            cols["start_us"] += x["start_us"].tolist()
            cols["end_us"] += end.tolist() if end is not None else [None] * n
            cols["latency_us"] += x["latency_us"].tolist()
            cols["device_us"] += x["device_us"].tolist()
            cols["transfer_us"] += call_transfer.tolist()
            cols["sync_us"] += (x["latency_us"] - call_transfer).tolist()
            cols["bytes"] += x["bytes"].tolist()
            cols["group_size"] += x["group_size"].tolist()
    return cols
