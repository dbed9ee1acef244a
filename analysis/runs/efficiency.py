"""Where the scaling efficiency went: the lost points, 100 × (1 − efficiency), split into parts.

Neither HTA nor tb-profiler says this. Every phase share below is a fraction of its own run's
step (steps.csv phases, the trace's exposed share), so the split needs no common clock:

    1 − E = Σ_x (f_x,ddp − E · f_x,single)        (Σ_x f_x = 1 in each run)

`E` is the run's measured scaling efficiency (throughput based), `f_x` the share of phase `x` in
the step. Each part is 100 × that difference for its phase:

- exposed_comm: communication not hidden under computation (the trace's exposed share: DDP's
  all-reduces, ZeRO-1's broadcasts, FSDP2's all-gathers and reduce-scatters that nothing hides),
  less the part of it spent waiting for other ranks to arrive (`stragglers`);
- stragglers: the collectives' sync wait per step (latency beyond the fastest rank's transfer),
  capped at the exposed share: time this rank waited for the slowest rank;
- data: the data-loader wait beyond the single run's, scaled by E;
- ddp_overhead: the mode's own per-step cost (DDP: reducer, bucket copies; ZeRO-1: its
  partitioned step and broadcasts; FSDP2: its all-gather copies and reduce-scatters), from the
  1-rank run of the same workload and strategy (analysis.runs.family): (its step − the single
  step) ÷ this run's step; null when the runs have none;
- host_contention: what steps measured while other processes ran cost, from steps.csv
  `other_cpu_cores` (analysis.runs.quiet): `h` = the share of a run's step time its busy steps
  added over its quiet pace (0 when its headline is over the quiet steps), and the part is
  100 × (h_ddp − E · h_single), carved out of the compute slowdown (a busy host slows every
  phase, compute most); null when either run has no per-step load or no quiet step;
- contention: the rest of the compute slowdown (forward, backward less exposed comm, optimizer)
  of running beside other ranks (shared cores, memory bandwidth): DDP's own compute slowdown;
- residual: the loss less the named parts, i.e. loop time outside the timed phases and the
  mismatch between the profiled and unprofiled steps. Shown, never hidden; the parts sum exactly.

Definitions with a worked example: docs/reference/metrics.md §7a.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from analysis.runs.entry import RunEntry, is_measured
from analysis.runs.groups import GroupEntry
from profiler.runfolder.schema import PROCESS_GROUP_MODES

__all__ = ["PARTS", "attach_efficiency_loss", "efficiency_loss_pts", "largest_part"]

# The same-workload key of a run entry (analysis.runs.groups.workload_key).
WorkloadKey = Callable[[RunEntry], tuple]

# The loop phases each strategy communicates in (analysis.runs.family strategies).
COMM_PHASES = {
    "ddp": ("backward",),
    "zero1": ("backward", "optimizer"),
    "fsdp": ("forward", "backward"),
    "fsdp_keep": ("forward", "backward"),
}
PARTS = (
    "exposed_comm",
    "stragglers",
    "data",
    "ddp_overhead",
    "host_contention",
    "contention",
    "residual",
)
# Parts measured only when their inputs exist; a group whose runs lack one folds it back into
# contention, where it sits when unmeasured.
OPTIONAL_PARTS = ("ddp_overhead", "host_contention")


def _shares(run: RunEntry) -> dict[str, float] | None:
    """Mean over ranks of each phase's share of its step (steps.csv), exposed comm from traces."""
    rows = [p for p in run.phases_per_rank_s if p.get("step_time")]
    if not rows:
        return None
    grouped = run.mode in PROCESS_GROUP_MODES
    exposed = (run.exposed_comm_pct or 0.0) / 100 if grouped else 0.0
    # The exposed share is carved out of the phases the mode communicates in (as the phase
    # table does) and never exceeds them: DDP's all-reduces run inside backward, ZeRO-1 also
    # broadcasts in its optimizer step, FSDP2 all-gathers in forward too.
    phases = COMM_PHASES.get(run.strategy or "", ("backward",))
    timed = sum(statistics.fmean(p[ph] / p["step_time"] for p in rows) for ph in phases)
    exposed = min(exposed, timed)
    compute = statistics.fmean(
        (p["forward"] + p["backward"] + p["optimizer"]) / p["step_time"] for p in rows
    )
    return {
        "data": statistics.fmean(p["data"] / p["step_time"] for p in rows),
        "exposed": exposed,
        "compute": compute - exposed,
        "sync_wait": min(_sync_share(run), exposed),
    }


def _sync_share(run: RunEntry) -> float:
    """Sync wait per step as a share of the traced step (collectives: mean over ranks)."""
    trace = run.trace or {}
    ranks = [r for r in trace.get("ranks") or [] if r.get("step_time_us_mean") and r.get("steps")]
    if not ranks:
        return 0.0
    sync_us = sum(c.get("sync_us_total") or 0.0 for c in trace.get("collectives") or [])
    steps = statistics.fmean(r["steps"] for r in ranks)
    step_us = statistics.fmean(r["step_time_us_mean"] for r in ranks)
    return max(sync_us / steps / step_us, 0.0)


def _step_s(run: RunEntry) -> float | None:
    """Seconds per step implied by the throughput (global batch ÷ samples/s)."""
    if not run.samples_per_s or not run.global_batch:
        return None
    return run.global_batch / run.samples_per_s


def efficiency_loss_pts(
    run: RunEntry, single: RunEntry, ddp1: RunEntry | None = None
) -> dict[str, float | None] | None:
    """The split of one DDP run's lost efficiency points against its `single` baseline; `ddp1` is
    a 1-rank DDP run of the same workload (for ddp_overhead). None without the inputs."""
    eff = run.scaling_efficiency
    mine, base = _shares(run), _shares(single)
    if eff is None or mine is None or base is None:
        return None
    parts: dict[str, float | None] = {
        "exposed_comm": 100 * (mine["exposed"] - mine["sync_wait"]),
        "stragglers": 100 * mine["sync_wait"],
        "data": 100 * (mine["data"] - eff * base["data"]),
        "ddp_overhead": None,
    }
    compute = 100 * (mine["compute"] - eff * base["compute"])
    t_n, t_1 = _step_s(run), _step_s(single)
    t_ddp1 = _step_s(ddp1) if ddp1 is not None else None
    if t_n and t_1 and t_ddp1:
        parts["ddp_overhead"] = 100 * (t_ddp1 - t_1) / t_n
    h_n, h_1 = run.host_contention_frac, single.host_contention_frac
    parts["host_contention"] = (
        100 * (h_n - eff * h_1) if h_n is not None and h_1 is not None else None
    )
    parts["contention"] = (
        compute - (parts["ddp_overhead"] or 0.0) - (parts["host_contention"] or 0.0)
    )
    loss = 100 * (1 - eff)
    parts["residual"] = loss - sum(v or 0.0 for v in parts.values())
    return parts


def _ddp1_for(run: RunEntry, ddp1s: list[RunEntry], key: WorkloadKey) -> RunEntry | None:
    same = [d for d in ddp1s if key(d) == key(run) and d.strategy == run.strategy]
    seeded = [d for d in same if d.seed == run.seed]
    return (seeded or same or [None])[0]


def attach_efficiency_loss(
    runs: list[RunEntry], groups: list[GroupEntry], key: WorkloadKey
) -> None:
    """Fill `efficiency_loss_pts` of every DDP, ZeRO-1 and FSDP run (world size > 1) with a
    baseline and of every such group: the mean of its runs' parts, the residual made so the
    parts sum exactly to 100 × (1 − the group's mean efficiency). `key(run)` is the
    same-workload key."""
    by_id = {r.run_id: r for r in runs}
    ok = [r for r in runs if is_measured(r)]
    ddp1s = [r for r in ok if r.mode in PROCESS_GROUP_MODES and r.world_size == 1]
    for run in ok:
        run.efficiency_loss_pts = None
        single = by_id.get(run.baseline_run_id) if run.baseline_run_id else None
        if run.mode not in PROCESS_GROUP_MODES or (run.world_size or 1) < 2 or single is None:
            continue
        run.efficiency_loss_pts = efficiency_loss_pts(run, single, _ddp1_for(run, ddp1s, key))
    for group in groups:
        group.efficiency_loss_pts = _group_split(group, by_id)


def _group_split(
    group: GroupEntry, by_id: dict[str, RunEntry]
) -> dict[str, float | None] | None:
    splits = [by_id[r].efficiency_loss_pts for r in group.run_ids]
    splits = [s for s in splits if s]
    eff = group.scaling_efficiency_mean
    if not splits or eff is None or group.mode not in PROCESS_GROUP_MODES:
        return None
    parts: dict[str, float | None] = {}
    for name in PARTS[:-1]:
        values = [s[name] for s in splits if s.get(name) is not None]
        # A part measured in only some runs (ddp_overhead) stays null rather than half-averaged.
        parts[name] = statistics.fmean(values) if len(values) == len(splits) else None
    # A part left null: the runs that had it fold it back into contention.
    folded = [p for p in OPTIONAL_PARTS if parts[p] is None]
    parts["contention"] = statistics.fmean(
        s["contention"] + sum(s.get(p) or 0.0 for p in folded) for s in splits
    )
    parts["residual"] = 100 * (1 - eff) - sum(v or 0.0 for v in parts.values())
    return parts


def largest_part(parts: dict[str, float | None]) -> tuple[str, float] | None:
    """The named part (residual excluded) that cost the most points; None when none cost any."""
    named = [(k, v) for k, v in parts.items() if k != "residual" and v is not None and v > 0]
    return max(named, key=lambda kv: kv[1]) if named else None
