"""Groups of the runs JSON: the runs of one configuration that differ only by seed, their mean ±
sample std per statistic and their throughput's spread (docs/reference/metrics.md §7), and the
one same-workload key that baselines, groups and findings all use.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

import msgspec

from analysis.runs.entry import RunEntry, is_measured, mean_std
from analysis.runs.rounds import round_stats

__all__ = [
    "GROUP_KEY",
    "GROUP_STATS",
    "MODE_ORDER",
    "WORKLOAD_KEY",
    "WorkloadKey",
    "GroupEntry",
    "group_runs",
    "same_workload",
    "spread",
    "workload_key",
]

# "Same workload": runs that agree on all of these ran the same problem on the same kind of machine,
# so their throughput can be compared or pooled. `model`, `dataset` and `loss` are the spec strings
# as given (a user's `mypkg.nets:build` pairs with itself), with the factories' arguments
# (entry.args_text); `fixed_batch` is the batch the scaling mode holds fixed (global for strong,
# per-device for weak); runs from different OSes or device types are never pooled; a script
# run's `workload` (its script's hash and arguments, or --workload) stands for the problem it
# ran. Baselines, groups and findings all use this one key.
class WorkloadKey(msgspec.Struct, kw_only=True):
    """The same-workload key's fields, first in every group and family entry of the runs JSON."""

    workload: str | None = None
    model: str | None = None
    model_args: str = ""
    dataset: str | None = None
    dataset_args: str = ""
    loss: str = "cross_entropy"
    scaling: str | None = None
    fixed_batch: int | None = None
    amp: str | None = None  # none | fp16 | bf16
    device_type: str | None = None
    os: str | None = None


WORKLOAD_KEY = tuple(f.name for f in msgspec.structs.fields(WorkloadKey))
# `strategy` tells DDP from ZeRO-1 and FSDP2 with and without resharding (analysis.runs.family).
GROUP_KEY = (*WORKLOAD_KEY, "mode", "strategy", "backend", "world_size")
GROUP_STATS = (
    "samples_per_s",
    "speedup",
    "scaling_efficiency",
    "test_loss",
    "top1_pct",
    "top5_pct",
    "perplexity",
)
# Runs and groups are listed in the family's order: single, DP, DDP, then the sharded members.
MODE_ORDER = {"single": 0, "dp": 1, "ddp": 2, "zero1": 3, "fsdp": 4, "fsdp_keep": 5}


class GroupEntry(WorkloadKey, kw_only=True):
    """One group of the runs JSON (`groups[]`), in its field order: the GROUP_KEY values, the
    runs it pools, what they share (caption, script, advice, the baseline's noise), mean and
    sample std (n−1) over its runs of every GROUP_STATS statistic, the mean comm shares, the
    throughput's min, max and spread (`spread`) and the efficiency-loss split of its runs
    (analysis.runs.efficiency). A field a runs JSON lacks reads as empty."""

    mode: str | None = None
    strategy: str | None = None  # ddp | zero1 | fsdp | fsdp_keep (analysis.runs.family)
    backend: str | None = None
    world_size: int | None = None
    n_seeds: int | None = None
    n_runs: int | None = None
    run_ids: list[str] = []
    workload_label: str = ""
    script: str | None = None
    advice: dict[str, str] = {}
    baseline_noise_pct: float | None = None
    samples_per_s_mean: float | None = None  # samples/s
    samples_per_s_std: float | None = None
    speedup_mean: float | None = None  # ×
    speedup_std: float | None = None
    scaling_efficiency_mean: float | None = None  # ratio (1.0 = linear)
    scaling_efficiency_std: float | None = None
    test_loss_mean: float | None = None
    test_loss_std: float | None = None
    top1_pct_mean: float | None = None
    top1_pct_std: float | None = None
    top5_pct_mean: float | None = None
    top5_pct_std: float | None = None
    perplexity_mean: float | None = None
    perplexity_std: float | None = None
    comm_pct_mean: float | None = None  # % of step
    exposed_comm_pct_mean: float | None = None  # % of step
    samples_per_s_min: float | None = None
    samples_per_s_max: float | None = None
    samples_per_s_spread_pct: float | None = None  # (max − min) ÷ mean × 100
    # Over the group's rounds (analysis.runs.rounds.round_stats): medians and 95% intervals.
    n_rounds: int | None = None
    speedup_median: float | None = None  # ×
    speedup_ci95_low: float | None = None
    speedup_ci95_high: float | None = None
    scaling_efficiency_median: float | None = None  # ratio
    scaling_efficiency_ci95_low: float | None = None
    scaling_efficiency_ci95_high: float | None = None
    samples_per_s_median: float | None = None  # samples/s
    samples_per_s_ci95_low: float | None = None
    samples_per_s_ci95_high: float | None = None
    throughput_basis: str | None = None  # quiet | all | mixed
    busy_run_ids: list[str] = []
    noisy_run_ids: list[str] = []
    efficiency_loss_pts: dict[str, float | None] | None = None


def workload_key(run: RunEntry | GroupEntry) -> tuple:
    """The "same workload" key of a run or group entry: its WORKLOAD_KEY values."""
    return tuple(getattr(run, k) for k in WORKLOAD_KEY)


def same_workload(a: RunEntry | GroupEntry, b: RunEntry | GroupEntry) -> bool:
    """Whether two entries ran the same workload (WORKLOAD_KEY)."""
    return workload_key(a) == workload_key(b)


def spread(values: Iterable[float | None]) -> dict[str, float | None]:
    """samples_per_s_min / _max over a group's runs and their spread, (max − min) ÷ mean × 100
    (None with fewer than two runs)."""
    xs = [v for v in values if v is not None]
    if not xs:
        return {
            "samples_per_s_min": None,
            "samples_per_s_max": None,
            "samples_per_s_spread_pct": None,
        }
    spread = 100 * (max(xs) - min(xs)) / statistics.fmean(xs) if len(xs) > 1 else None
    return {"samples_per_s_min": min(xs), "samples_per_s_max": max(xs),
            "samples_per_s_spread_pct": spread}  # fmt: skip


def _group(key: tuple, members: list[RunEntry], by_id: dict[str, RunEntry]) -> GroupEntry:
    stats: dict[str, Any] = {}
    for stat in GROUP_STATS:
        stats[f"{stat}_mean"], stats[f"{stat}_std"] = mean_std(getattr(m, stat) for m in members)
    first = members[0]  # what the group's runs share: caption, script, advice, baseline's noise
    return GroupEntry(
        **dict(zip(GROUP_KEY, key, strict=True)),
        n_seeds=len({m.seed for m in members}),
        n_runs=len(members),
        run_ids=[m.run_id for m in members],
        workload_label=first.workload_label,
        script=first.script,
        advice=first.advice,
        baseline_noise_pct=first.baseline_noise_pct,
        **stats,
        comm_pct_mean=mean_std(m.comm_pct for m in members)[0],
        exposed_comm_pct_mean=mean_std(m.exposed_comm_pct for m in members)[0],
        **spread(m.samples_per_s for m in members),
        **round_stats(members, by_id),  # medians and 95% CIs over rounds
    )


def group_runs(runs: list[RunEntry]) -> list[GroupEntry]:
    """Mean ± sample std (n−1) over the seeds of each configuration (GROUP_KEY), and the medians
    and intervals over its rounds (analysis.runs.rounds); only measured runs (ok or interrupted,
    is_measured) count. Sorted by workload, family member, backend, world size."""
    by_id = {r.run_id: r for r in runs}
    buckets: dict[tuple, list[RunEntry]] = {}
    for run in runs:
        if is_measured(run):
            buckets.setdefault(tuple(getattr(run, k) for k in GROUP_KEY), []).append(run)
    groups = [_group(key, members, by_id) for key, members in buckets.items()]
    return sorted(
        groups,
        key=lambda g: (
            *(str(getattr(g, k)) for k in WORKLOAD_KEY),
            MODE_ORDER.get(g.strategy or g.mode, 9),
            str(g.backend),
            g.world_size or 0,
        ),
    )
