"""The findings' rules, judged here against THRESHOLDS so that the report only words them: each rule
reads the typed runs JSON (analysis.runs.runsjson) and returns its cases, one typed entry per
sentence the report will say. A rule that lacks its inputs (no baseline, no traces, one device)
returns nothing rather than something vague. Definitions: docs/reference/metrics.md §7.
"""

from __future__ import annotations

import statistics

import msgspec

from analysis.project.view import SkippedInput
from analysis.runs.entry import RunEntry
from analysis.runs.groups import WORKLOAD_KEY, GroupEntry, workload_key
from analysis.runs.notes import Advice, advice_of, error_words
from analysis.runs.runsjson import InvalidEntry, RunsJson
from profiler.runfolder.hostload import BUSY_OTHER_CORES_FRAC, is_busy
from profiler.runfolder.schema import PROCESS_GROUP_MODES

__all__ = ["THRESHOLDS", "FindingCases", "finding_cases", "name_keys"]

# The thresholds, in one place so the text and the rule can't drift apart.
THRESHOLDS = {
    "efficiency_good": 0.80,  # scaling efficiency at or above this is good scaling
    "efficiency_poor": 0.50,  # below this the extra devices mostly wait
    # Above this the speedup beats linear: more often a slow baseline (oversubscribed threads, a
    # busy machine) than real cache effects, so the finding asks to re-measure instead of praising.
    "efficiency_superlinear": 1.10,
    "exposed_comm_pct": 10.0,  # exposed comm above this share of the step is worth tuning
    "memory_imbalance_pct": 10.0,  # runs JSON memory_imbalance_pct: (max / min − 1) × 100
    "accuracy_drop_pp": 1.0,  # top-1 drop vs single, in percentage points
    "backend_ratio": 1.05,  # throughput ratio between backends below this is noise
    # env.host_load: a run is "busy" when other processes used more than this share of the cores
    # (other_cpu_cores_mean > frac × cores) while it measured; the verdict then says so.
    "busy_other_cores_frac": BUSY_OTHER_CORES_FRAC,  # 0.5, profiler.runfolder.hostload: one rule
    "few_measured_steps": 8,  # fewer unprofiled measured steps than this: throughput is noisy
    # A part of "where the efficiency went" beyond this many points (the whole loss is at most
    # 100) means its runs were measured under different conditions: the verdict says so.
    "split_part_max_pts": 100.0,
    # (max − min) ÷ mean of one group's throughput over its seeds above this: drift or noise
    "seed_spread_pct": 10.0,
}


class ScalingCase(msgspec.Struct, kw_only=True):
    """Speedup and efficiency of one parallel group. `judged`: one_rank (nothing to scale: DDP's
    own cost and noise), superlinear, good, poor or fair (THRESHOLDS); `exposed_comm_pct` the
    mean exposed share of its runs (% of step), `exposed_over` above the threshold; `slower` a
    speedup below 1 (slower than the single device); `busy_run_ids` its runs and their baselines
    measured on a busy machine; `plain_ddp` whether the group is plain DDP (its exposed
    communication is allreduce)."""

    group: GroupEntry
    advice: Advice
    run_ids: list[str]
    judged: str
    exposed_comm_pct: float | None = None
    exposed_over: bool = False
    slower: bool = False
    busy_run_ids: list[str] = []
    plain_ddp: bool = False
    quiet_basis: bool = False  # the group's figures stand on quiet steps (analysis.runs.rounds)


class BackendPair(msgspec.Struct, kw_only=True):
    """NCCL and GLOO groups of one workload, family member and world size; `ratio` = faster ÷
    slower throughput."""

    nccl: GroupEntry
    gloo: GroupEntry
    fast: str
    slow: str
    ratio: float
    tie: bool  # ratio under THRESHOLDS["backend_ratio"]


class DpDdpPair(msgspec.Struct, kw_only=True):
    """A DP and a DDP run of one workload, world size and seed; `ratio` = DDP ÷ DP throughput."""

    dp: RunEntry
    ddp: RunEntry
    ratio: float


class DeviceSpot(msgspec.Struct, kw_only=True):
    rank: int | None = None
    device: str | None = None


class MemoryBalance(msgspec.Struct, kw_only=True):
    """A group's worst memory imbalance (its run's `memory_imbalance_pct`, % more on the fullest
    device than on the emptiest), over the `n_runs` runs with two or more memory entries."""

    run: RunEntry
    pct: float
    fullest: DeviceSpot
    emptiest: DeviceSpot
    n_runs: int
    run_ids: list[str]
    balanced: bool  # under THRESHOLDS["memory_imbalance_pct"]


class AccuracyPair(msgspec.Struct, kw_only=True):
    """A parallel group's mean top-1 (%) against the single-device group of its workload."""

    group: GroupEntry
    top1_pct: float
    single_top1_pct: float
    dropped: bool  # by more than THRESHOLDS["accuracy_drop_pp"]
    run_ids: list[str]


class NoEval(msgspec.Struct, kw_only=True):
    note: str
    run_ids: list[str]


class BusyRun(msgspec.Struct, kw_only=True):
    """A run measured while other processes used `other_cores` of the machine's `cores`;
    `quiet_basis`: its throughput stands on the steps measured while the machine was quiet."""

    run: RunEntry
    other_cores: float
    cores: int
    quiet_basis: bool = False


class StatusGroup(msgspec.Struct, kw_only=True):
    """Runs without `ok` status sharing one status and reason (analysis.runs.notes.error_words)."""

    status: str
    reason: str
    run_ids: list[str]


class FindingCases(msgspec.Struct, kw_only=True):
    """Every rule's cases, in the order the report states them. `name_keys`: the parts (model,
    os) a sentence names because the report mixes several."""

    name_keys: tuple[str, ...]
    scaling: list[ScalingCase]
    backends: list[BackendPair]
    dp_vs_ddp: list[DpDdpPair]
    memory: list[MemoryBalance]
    accuracy: list[AccuracyPair]
    no_eval: list[NoEval]
    seed_spread: list[GroupEntry]
    busy: list[BusyRun]
    statuses: list[StatusGroup]
    warned: list[RunEntry]  # measured runs with warnings
    skipped: list[SkippedInput]
    invalid: list[InvalidEntry]


def name_keys(groups: list[GroupEntry]) -> tuple[str, ...]:
    """`model` and `os`, those the groups differ by."""
    return tuple(k for k in ("model", "os") if len({getattr(g, k) for g in groups}) > 1)


def _judge(group: GroupEntry, eff: float) -> str:
    t = THRESHOLDS
    if group.world_size == 1:
        return "one_rank"
    if eff > t["efficiency_superlinear"]:
        return "superlinear"
    if eff >= t["efficiency_good"]:
        return "good"
    return "poor" if eff < t["efficiency_poor"] else "fair"


def scaling_case(group: GroupEntry, doc: RunsJson) -> ScalingCase | None:
    """The ScalingCase of one group; None for a single-device group or one without a speedup."""
    eff = group.scaling_efficiency_mean
    if group.mode == "single" or group.speedup_mean is None or eff is None:
        return None
    runs = doc.by_id(measured=True)
    members = doc.members(group)
    exposed = [m.exposed_comm_pct for m in members if m.exposed_comm_pct is not None]
    pct = statistics.fmean(exposed) if exposed else None
    bases = [runs[b] for m in members if (b := m.baseline_run_id) in runs]
    busy = sorted({r.run_id for r in [*members, *bases] if is_busy(r.host_load)})
    return ScalingCase(
        group=group, advice=advice_of(group.advice), run_ids=[m.run_id for m in members],
        judged=_judge(group, eff), exposed_comm_pct=pct,
        exposed_over=pct is not None and pct > THRESHOLDS["exposed_comm_pct"],
        slower=group.speedup_mean < 1, busy_run_ids=busy, plain_ddp=is_plain_ddp(group),
        quiet_basis=group.throughput_basis == "quiet",
    )  # fmt: skip


def is_plain_ddp(entry: RunEntry | GroupEntry) -> bool:
    """Plain DDP: mode ddp without ZeRO-1 (a record without a strategy is DDP)."""
    return entry.mode == "ddp" and (entry.strategy or "ddp") == "ddp"


def _backends(groups: list[GroupEntry]) -> list[BackendPair]:
    by_key: dict[tuple, dict[str, GroupEntry]] = {}
    for g in groups:
        if g.mode in PROCESS_GROUP_MODES and g.samples_per_s_mean:
            # DDP against DDP, FSDP2 against FSDP2
            key = (*workload_key(g), g.strategy, g.world_size)
            by_key.setdefault(key, {})[str(g.backend)] = g
    out = []
    for found in by_key.values():
        if {"nccl", "gloo"} <= found.keys():
            nccl, gloo = found["nccl"], found["gloo"]
            n, gl = nccl.samples_per_s_mean or 0.0, gloo.samples_per_s_mean or 0.0
            fast, slow, ratio = ("NCCL", "GLOO", n / gl) if n >= gl else ("GLOO", "NCCL", gl / n)
            out.append(BackendPair(nccl=nccl, gloo=gloo, fast=fast, slow=slow, ratio=ratio,
                                   tie=ratio < THRESHOLDS["backend_ratio"]))  # fmt: skip
    return out


def _dp_vs_ddp(runs: list[RunEntry]) -> list[DpDdpPair]:
    ok = [r for r in runs if r.samples_per_s]
    key = (*WORKLOAD_KEY, "world_size", "seed")
    return [
        DpDdpPair(dp=dp, ddp=ddp, ratio=(ddp.samples_per_s or 0.0) / (dp.samples_per_s or 1.0))
        for dp in ok
        if dp.mode == "dp"
        for ddp in ok
        if is_plain_ddp(ddp) and all(getattr(dp, k) == getattr(ddp, k) for k in key)
    ]


def _imbalance(run: RunEntry) -> tuple[float, dict, dict] | None:
    """(the run's `memory_imbalance_pct`, fullest entry, emptiest entry): the number is
    compare_runs' own, the entries only name the devices."""
    metric = run.memory_metric
    entries = [m for m in run.memory if isinstance(m.get(metric), int | float)]
    if run.memory_imbalance_pct is None or len(entries) < 2:
        return None
    hi = max(entries, key=lambda m: m[metric])
    lo = min(entries, key=lambda m: m[metric])
    return run.memory_imbalance_pct, hi, lo


def _spot(entry: dict) -> DeviceSpot:
    return DeviceSpot(rank=entry.get("rank"), device=entry.get("device"))


def _memory(group: GroupEntry, doc: RunsJson) -> MemoryBalance | None:
    """Memory balance across the devices/ranks of a group's runs (its worst run speaks)."""
    scored = [(imb, m) for m in doc.members(group) if (imb := _imbalance(m))]
    if not scored:
        return None
    (pct, hi, lo), run = max(scored, key=lambda x: x[0][0])
    return MemoryBalance(
        run=run, pct=pct, fullest=_spot(hi), emptiest=_spot(lo), n_runs=len(scored),
        run_ids=[m.run_id for _, m in scored], balanced=pct < THRESHOLDS["memory_imbalance_pct"],
    )  # fmt: skip


def _accuracy(groups: list[GroupEntry]) -> list[AccuracyPair]:
    singles = {workload_key(g): g for g in groups if g.mode == "single"}
    out = []
    for g in groups:
        base = singles.get(workload_key(g))
        if g.mode == "single" or base is None:
            continue
        a, b = g.top1_pct_mean, base.top1_pct_mean
        if a is None or b is None:
            continue
        out.append(AccuracyPair(group=g, top1_pct=a, single_top1_pct=b,
                                dropped=b - a > THRESHOLDS["accuracy_drop_pp"],
                                run_ids=[*g.run_ids, *base.run_ids]))  # fmt: skip
    return out


def _no_eval(runs: list[RunEntry]) -> list[NoEval]:
    by_note: dict[str, list[str]] = {}
    for run in runs:
        if run.eval_note:
            by_note.setdefault(str(run.eval_note), []).append(str(run.run_id))
    return [NoEval(note=note, run_ids=ids) for note, ids in by_note.items()]


def _busy(runs: list[RunEntry]) -> list[BusyRun]:
    return [
        BusyRun(run=r, other_cores=r.host_load["other_cpu_cores_mean"], cores=r.host_load["cores"],
                quiet_basis=r.throughput_basis == "quiet")  # fmt: skip
        for r in runs
        if r.host_load and is_busy(r.host_load)
    ]


def _statuses(runs: list[RunEntry]) -> list[StatusGroup]:
    by_reason: dict[tuple[str, str], list[str]] = {}
    for r in runs:
        if r.status != "ok":
            key = (str(r.status or None), error_words(r.error))
            by_reason.setdefault(key, []).append(r.run_id)
    return [StatusGroup(status=s, reason=why, run_ids=ids) for (s, why), ids in by_reason.items()]


def finding_cases(doc: RunsJson) -> FindingCases:
    """Every rule's cases for the runs JSON `doc`."""
    measured, groups = doc.measured(), doc.groups
    limit = THRESHOLDS["seed_spread_pct"]
    return FindingCases(
        name_keys=name_keys(groups),
        scaling=[c for g in groups if (c := scaling_case(g, doc))],
        backends=_backends(groups),
        dp_vs_ddp=_dp_vs_ddp(measured),
        memory=[m for g in groups if (m := _memory(g, doc))],
        accuracy=_accuracy(groups),
        no_eval=_no_eval(measured),
        seed_spread=[g for g in groups if (g.samples_per_s_spread_pct or 0.0) > limit],
        busy=_busy(measured),
        statuses=_statuses(doc.runs),
        warned=[r for r in measured if r.warnings],
        skipped=doc.skipped,
        invalid=doc.invalid,
    )
