"""The sweep view of the runs JSON (docs/reference/metrics.md §7): one headline row per group of
seeds with the means the groups do not hold, skipped runs folded by reason, the efficiency-loss
rows, and one representative run per group for the per-run detail that would repeat per seed.
"""

from __future__ import annotations

import statistics
from typing import Any

import msgspec

from analysis.runs.efficiency import PARTS
from analysis.runs.groups import MODE_ORDER, GroupEntry
from analysis.runs.runsjson import RunsJson

__all__ = [
    "HeadlineRow",
    "LossRow",
    "SkippedReason",
    "first_of_groups",
    "headline_rows",
    "loss_rows",
    "skipped_by_reason",
]


class HeadlineRow(msgspec.Struct, kw_only=True):
    """One group of seeds in the headline table: beside its group's numbers, the batch its scaling
    holds (global; per device for weak scaling), the time per epoch (mean of its runs' epoch wall
    times, s) and the peak memory per device (mean of each run's largest device peak, bytes)."""

    group: GroupEntry
    batch: int | None = None
    epoch_time_s: float | None = None
    peak_memory_bytes: float | None = None


def _mean(values: list[Any]) -> float | None:
    vals = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return statistics.fmean(vals) if vals else None


def headline_rows(doc: RunsJson) -> list[HeadlineRow]:
    """One row per group, in the shape of the GLOO/NCCL and Windows/Linux comparisons: sorted by
    platform, model, scaling, backend, mode and world size."""
    runs = doc.by_id()
    rows = []
    for g in doc.groups:
        members = [runs[i] for i in g.run_ids if i in runs]
        first = members[0] if members else None
        batch = None
        if first is not None:
            batch = first.global_batch if first.scaling != "weak" else first.per_device_batch
        rows.append(HeadlineRow(
            group=g, batch=batch, epoch_time_s=_mean([m.epoch_time_s for m in members]),
            peak_memory_bytes=_mean([m.peak_memory_bytes for m in members]),
        ))  # fmt: skip
    return sorted(
        rows,
        key=lambda r: (
            str(r.group.os),
            str(r.group.model),
            str(r.group.scaling),
            str(r.group.backend),
            MODE_ORDER.get(r.group.strategy or r.group.mode, 9),
            r.group.world_size or 0,
        ),
    )


class SkippedReason(msgspec.Struct, kw_only=True):
    """Skipped runs sharing one reason (their error's message)."""

    reason: str
    count: int
    run_ids: list[str]


def skipped_by_reason(doc: RunsJson) -> list[SkippedReason]:
    """Skipped runs folded to one entry per reason, most frequent first (a 96-run CPU sweep had
    72 skipped runs restating three reasons; one line each is enough)."""
    folded: dict[str, list[str]] = {}
    for run in doc.runs:
        if run.status == "skipped":
            err = run.error
            reason = err.get("message") if isinstance(err, dict) else err
            folded.setdefault(str(reason or "no reason recorded"), []).append(str(run.run_id))
    return [
        SkippedReason(reason=reason, count=len(ids), run_ids=sorted(ids))
        for reason, ids in sorted(folded.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]


def first_of_groups(doc: RunsJson) -> RunsJson:
    """`doc` with only the first run of each group: per-run detail (operator tables, memory
    figures) that would repeat itself once per seed is shown for one run per group."""
    keep = {g.run_ids[0] for g in doc.groups if g.run_ids}
    return msgspec.structs.replace(doc, runs=[r for r in doc.runs if r.run_id in keep])


class LossRow(msgspec.Struct, kw_only=True):
    """One DDP group's efficiency-loss split (analysis.runs.efficiency): its efficiency (ratio),
    the points lost, 100 × (1 − efficiency), and the parts (points; every one of PARTS, None
    where not measured)."""

    group: GroupEntry
    scaling_efficiency_mean: float
    loss_pts: float
    parts: dict[str, float | None]


def loss_rows(doc: RunsJson) -> list[LossRow]:
    """One row per group with a split and an efficiency."""
    return [
        LossRow(group=g, scaling_efficiency_mean=g.scaling_efficiency_mean,
                loss_pts=100 * (1 - g.scaling_efficiency_mean),
                parts={k: g.efficiency_loss_pts.get(k) for k in PARTS})
        for g in doc.groups
        if g.efficiency_loss_pts and g.scaling_efficiency_mean is not None
    ]  # fmt: skip
