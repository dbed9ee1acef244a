"""The verdict's numbers, per same-workload set of groups (docs/reference/metrics.md §7): the
parallel group it is about, its loss split's largest part (or what gained above linear), its
static-memory difference from the single run, the projection at VERDICT_RANKS, what to try, and
the caveats (busy machine, few steps, superlinear efficiency, an unstable split). The report's
verdict only words them.
"""

from __future__ import annotations

import msgspec

from analysis.project.view import Check, Prediction, prediction_at
from analysis.runs.efficiency import PARTS, largest_part
from analysis.runs.family import SHARDED
from analysis.runs.familyview import FamilyEntry, family_of
from analysis.runs.groups import WORKLOAD_KEY, GroupEntry, workload_key
from analysis.runs.memory import StaticDelta, static_difference
from analysis.runs.notes import Advice, advice_of
from analysis.runs.rules import THRESHOLDS
from analysis.runs.runsjson import RunsJson
from analysis.runs.tune import TuneArm
from profiler.runfolder.hostload import is_busy

__all__ = ["VERDICT_RANKS", "Caveats", "Projected", "VerdictCase", "verdict_cases"]

VERDICT_RANKS = 8  # the projection the verdict quotes


class Projected(msgspec.Struct, kw_only=True):
    """The projection at VERDICT_RANKS; `inter_node_gbps` only when those ranks span nodes;
    `replay` the group's first replay with an error."""

    at: Prediction
    inter_node_gbps: float | None = None
    replay: Check | None = None


class Caveats(msgspec.Struct, kw_only=True):
    """What weakens a workload's verdict: `busy` of `runs` measured on a busy machine, `few`
    runs with fewer than THRESHOLDS["few_measured_steps"] unprofiled steps (`more_steps`: how to
    get more), a superlinear group of 2+ ranks, and the split's parts beyond ±THRESHOLDS
    ["split_part_max_pts"] (PARTS order); `busy_quiet` when every busy run's figures stand on
    its quiet steps (analysis.runs.quiet)."""

    runs: int
    busy: int
    busy_quiet: bool = False
    few: int
    more_steps: str
    superlinear: bool
    wild_parts: list[str]


class VerdictCase(msgspec.Struct, kw_only=True):
    """One workload's verdict. `first` names the workload (its first group); `group` is the
    parallel group with a speedup and the most ranks, then the fastest (None: no parallel run
    has a baseline). `efficiency_pct` = 100 × its mean efficiency, `lost_pts` the points short
    of 100. `largest` is the named part
    that cost the most points; with it and efficiency under 100% the verdict names it, else a
    split says what gained (`gain`: the part with the fewest points). `memory` is the static
    difference of its first run from that run's baseline, `memory_shown` when it is not the same.
    `bucket_tip`: gradient-as-bucket-view would save `memory.cause_bytes`; `best_tune`: a tuner's
    best arm (built-in runs only); `tune_tip`: otherwise, DDP's tuning advice. `noisy`: the
    group's figures are known noise (`noisy_run_ids`), so none is quoted; `on_quiet`: some of its
    runs were busy and its figures stand on their quiet steps; `rounds`: the rounds its median
    and 95% interval are over (quoted from 2); `family`: the workload's family comparisons."""

    first: GroupEntry
    advice: Advice
    group: GroupEntry | None = None
    efficiency_pct: float = 0.0
    lost_pts: float = 100.0  # 100 − efficiency_pct
    largest: tuple[str, float] | None = None
    gain: tuple[str, float] | None = None
    name_largest: bool = False
    memory: StaticDelta | None = None
    memory_shown: bool = False
    projected: Projected | None = None
    bucket_tip: bool = False
    best_tune: TuneArm | None = None
    tune_tip: bool = False
    noisy: bool = False
    on_quiet: bool = False
    rounds: int = 0
    family: list[FamilyEntry] = []
    caveats: Caveats


def _pick(groups: list[GroupEntry]) -> GroupEntry | None:
    """The DDP/DP group with a speedup and the most ranks (then the fastest), a ZeRO-1/FSDP2
    group only when there is none (the family line compares those)."""
    cands = [g for g in groups if g.mode != "single" and g.speedup_mean is not None]
    plain = [g for g in cands if g.strategy not in SHARDED]
    return max(plain or cands, key=lambda g: (g.world_size or 0, g.speedup_mean), default=None)


def _projected(g: GroupEntry, doc: RunsJson) -> Projected | None:
    runs = doc.by_id(measured=True)
    mine = [r for r in g.run_ids if r in runs]
    key = workload_key(runs[mine[0]]) if mine else None
    for p in doc.projections:
        base = runs.get(p.run_id)
        replays = [r for r in p.replays if r.run_id in g.run_ids]
        if not replays and (base is None or workload_key(base) != key):
            continue
        at = prediction_at(p, VERDICT_RANKS)
        if at is None:
            continue
        # The link between nodes only matters past one node's ranks.
        across = VERDICT_RANKS > (p.inputs.gpus_per_node or VERDICT_RANKS)
        replay = replays[0] if replays and replays[0].error_pct is not None else None
        return Projected(at=at, inter_node_gbps=p.inputs.inter_node_gbps if across else None,
                         replay=replay)  # fmt: skip
    return None


def _memory(g: GroupEntry, doc: RunsJson) -> StaticDelta | None:
    runs = doc.by_id(measured=True)
    run = runs.get(g.run_ids[0]) if g.run_ids else None
    single = runs.get(run.baseline_run_id) if run and run.baseline_run_id else None
    return static_difference(run, single) if run and single else None


def _caveats(groups: list[GroupEntry], doc: RunsJson) -> Caveats:
    members = [m for g in groups for m in doc.members(g)]
    few = [r for r in members if (r.measured_steps or 0) < THRESHOLDS["few_measured_steps"]]
    limit = THRESHOLDS["split_part_max_pts"]
    wild = {name for g in groups for name, v in (g.efficiency_loss_pts or {}).items()
            if v is not None and abs(v) > limit}  # fmt: skip
    # A 1-rank group has nothing to scale (its ratio is DDP's own cost and noise): not judged.
    sup = [g for g in groups if (g.world_size or 1) > 1
           and (g.scaling_efficiency_mean or 0) > THRESHOLDS["efficiency_superlinear"]]  # fmt: skip
    busy = [r for r in members if is_busy(r.host_load)]
    return Caveats(
        runs=len(members), busy=len(busy), few=len(few),
        busy_quiet=bool(busy) and all(r.throughput_basis == "quiet" for r in busy),
        more_steps=advice_of(few[0].advice).more_steps if few else "",
        superlinear=bool(sup), wild_parts=[p for p in PARTS if p in wild],
    )  # fmt: skip


def _case(groups: list[GroupEntry], doc: RunsJson) -> VerdictCase:
    g = _pick(groups)
    case = VerdictCase(first=groups[0], advice=advice_of(groups[0].advice), group=g,
                       caveats=_caveats(groups, doc))  # fmt: skip
    if g is None:
        return case
    case.advice = advice_of(g.advice)
    case.noisy = bool(g.noisy_run_ids)
    case.on_quiet = bool(g.busy_run_ids) and g.throughput_basis == "quiet"
    case.rounds = (g.n_rounds or 0) if g.speedup_median is not None else 0
    case.family = family_of(doc.family, workload_key(g), WORKLOAD_KEY)
    case.efficiency_pct = 100 * (g.scaling_efficiency_mean or 0.0)
    case.lost_pts = 100 - case.efficiency_pct
    parts = g.efficiency_loss_pts
    if parts:
        case.largest = largest_part(parts)
        case.name_largest = case.largest is not None and case.efficiency_pct < 100
        values = [(k, v) for k, v in parts.items() if v is not None]
        case.gain = min(values, key=lambda kv: kv[1]) if values else None
    mem = case.memory = _memory(g, doc)
    case.memory_shown = mem is not None and not mem.same
    case.projected = _projected(g, doc)
    case.bucket_tip = bool(mem and mem.cause == "ddp_buckets_bytes" and mem.diff_bytes > 0)
    best = next((t.best for t in doc.tunes if t.best), None)
    if best and best.speedup_vs_baseline and not g.script:
        case.best_tune = best
    case.tune_tip = case.best_tune is None and g.mode == "ddp"
    return case


def verdict_cases(doc: RunsJson) -> list[VerdictCase]:
    """One VerdictCase per workload (WORKLOAD_KEY) with a group, in the groups' order."""
    by_workload: dict[tuple, list[GroupEntry]] = {}
    for g in doc.groups:
        by_workload.setdefault(workload_key(g), []).append(g)
    return [_case(groups, doc) for groups in by_workload.values()]
