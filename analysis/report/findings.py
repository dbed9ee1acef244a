"""Plain-language findings: each one words a case its rule judged in analysis.runs.rules, with the
threshold stated in its text. A rule without cases says nothing rather than something vague.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from analysis.runs.entry import RunEntry
from analysis.runs.family import LABELS
from analysis.runs.groups import GroupEntry
from analysis.runs.rules import (
    THRESHOLDS,
    AccuracyPair,
    BackendPair,
    BusyRun,
    FindingCases,
    MemoryBalance,
    ScalingCase,
    finding_cases,
)
from analysis.runs.runsjson import RunsJson, read_runs_json
from profiler.runfolder.schema import PROCESS_GROUP_MODES

__all__ = ["NAMES", "THRESHOLDS", "Finding", "findings", "run_name"]

NAMES = LABELS  # single, dp, ddp and the sharded members (analysis.runs.family)


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One sentence for the user; `severity` is good | warn | bad | info; `rule` names the rule."""

    rule: str
    severity: str
    text: str
    run_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_name(run: RunEntry | GroupEntry, keys: tuple[str, ...] = ()) -> str:
    """'DDP (GLOO)', 'FSDP2 (GLOO)', 'DP', 'Single'; prefixed with the model/OS when the report
    holds several."""
    kind = run.strategy or run.mode or ""
    mode = NAMES.get(kind, str(kind))
    grouped = run.mode in PROCESS_GROUP_MODES
    name = f"{mode} ({run.backend.upper()})" if grouped and run.backend else mode
    return " ".join([*(str(getattr(run, k)) for k in keys), name])


_JUDGED = {
    "one_rank": "one rank: DDP's own cost, no communication",
    "superlinear": "above linear",
    "good": "good scaling",
    "poor": "poor scaling",
    "fair": "fair scaling",
}


def _rule_text(judged: str) -> str:
    t = THRESHOLDS
    if judged == "one_rank":
        # One rank has nothing to scale: its ratio to the single run is DDP's own per-step cost
        # (reducer, bucket copies) plus run-to-run noise, which "where the efficiency went" uses.
        return "above 1.00× is noise between the runs"
    if judged == "superlinear":
        return (
            f"over {t['efficiency_superlinear'] * 100:.0f}% usually means the single-device "
            "baseline was slowed, e.g. by oversubscribed threads or a busy machine: re-measure it"
        )
    return (
        f"≥ {t['efficiency_good'] * 100:.0f}% is good, < {t['efficiency_poor'] * 100:.0f}% is poor"
    )


def scaling_finding(case: ScalingCase, multi: tuple[str, ...]) -> Finding:
    """Speedup and efficiency of one mode/backend/world-size group, plus its exposed comm."""
    g, t = case.group, THRESHOLDS
    n = len(case.run_ids)
    unit = "devices" if g.mode == "dp" else "ranks"
    unit = unit[:-1] if g.world_size == 1 else unit
    seeds = f", mean of {n} runs" if n > 1 else ""
    text = (
        f"{run_name(g, multi)} on {g.world_size} {unit} reached {g.speedup_mean:.2f}× vs single "
        f"({(g.scaling_efficiency_mean or 0.0) * 100:.0f}% efficiency{seeds}: "
        f"{_JUDGED[case.judged]}; {_rule_text(case.judged)})."
    )
    if case.exposed_comm_pct is not None:
        word = "allreduce" if case.plain_ddp else "communication"
        text += f" {case.exposed_comm_pct:.0f}% of step time is exposed {word}"
        text += (
            f" (above the {t['exposed_comm_pct']:.0f}% threshold: {case.advice.exposed})."
            if case.exposed_over
            else f" (within the {t['exposed_comm_pct']:.0f}% threshold)."
        )
    slower = case.slower
    severity = "bad" if slower else "good" if case.judged == "good" else "warn"
    if case.busy_run_ids:
        why = ("; the speedup uses only the steps measured while they were quiet"
               if case.quiet_basis else ", so this speedup is unreliable")  # fmt: skip
        text += (
            f" Measured on a busy machine: other processes used over "
            f"{t['busy_other_cores_frac']:.0%} of the cores during "
            f"{', '.join(case.busy_run_ids)}{why}."
        )
        severity = "bad" if slower else "warn"
    return Finding(rule="scaling", severity=severity, text=text, run_ids=case.run_ids)


def _memory(m: MemoryBalance, multi: tuple[str, ...]) -> Finding:
    """Memory balance across the devices/ranks of a group's runs (its worst run speaks)."""
    run, limit = m.run, THRESHOLDS["memory_imbalance_pct"]
    what = "peak RSS" if run.memory_metric == "peak_rss_bytes" else "peak allocated"
    dp = run.mode == "dp"
    worst = f", worst of {m.n_runs} runs" if m.n_runs > 1 else ""

    def where(spot: Any) -> str:
        return f"{spot.device}" if dp else f"rank {spot.rank} ({spot.device})"

    if m.balanced:
        text = (
            f"{run_name(run, multi)} on {run.world_size} {'devices' if dp else 'ranks'}: memory is "
            f"balanced ({what} differs by {m.pct:.0f}%{worst}; the threshold is {limit:.0f}%)."
        )
        return Finding(rule="memory", severity="good", text=text, run_ids=m.run_ids)
    text = (
        f"{run_name(run, multi)} holds {m.pct:.0f}% more memory on {where(m.fullest)} than on "
        f"{where(m.emptiest)} ({what}{worst}; imbalance threshold {limit:.0f}%)."
    )
    return Finding(rule="memory", severity="warn", text=text, run_ids=m.run_ids)


def _accuracy(a: AccuracyPair, multi: tuple[str, ...]) -> Finding:
    g, limit = a.group, THRESHOLDS["accuracy_drop_pp"]
    name, unit = run_name(g, multi), "devices" if g.mode == "dp" else "ranks"
    top1, base = a.top1_pct, a.single_top1_pct
    if a.dropped:
        text = (
            f"{name} on {g.world_size} {unit} lost accuracy vs single: top-1 {top1:.1f}% vs "
            f"{base:.1f}% (a drop over {limit:.0f} pp): consider SyncBatchNorm / lr scaling."
        )
        return Finding(rule="accuracy", severity="bad", text=text, run_ids=a.run_ids)
    text = (
        f"{name} on {g.world_size} {unit} held accuracy: top-1 {top1:.1f}% vs {base:.1f}% "
        f"single (within {limit:.0f} pp)."
    )
    return Finding(rule="accuracy", severity="good", text=text, run_ids=a.run_ids)


def _backend(b: BackendPair) -> Finding:
    limit = THRESHOLDS["backend_ratio"]
    if b.tie:
        text = "Backends: NCCL and GLOO throughput are a tie on the same run"
    else:
        text = f"Backends: {b.fast} {b.ratio:.1f}× faster than {b.slow} on the same run"
    g = b.nccl
    text += (
        f" ({g.model}, {NAMES.get(g.strategy or '', 'DDP')}, {g.world_size} ranks, {g.os}; differences under "
        f"{(limit - 1) * 100:.0f}% count as a tie)."
    )
    return Finding(rule="backends", severity="info", text=text,
                   run_ids=[*b.nccl.run_ids, *b.gloo.run_ids])  # fmt: skip


def _seed_spread(g: GroupEntry, multi: tuple[str, ...]) -> Finding:
    limit = THRESHOLDS["seed_spread_pct"]
    return Finding(rule="seed_spread", severity="warn", run_ids=list(g.run_ids), text=(
        f"{run_name(g, multi)} at {g.world_size}: its {g.n_runs} runs' throughput spans "
        f"{g.samples_per_s_min:.1f}–{g.samples_per_s_max:.1f} samples/s, a spread of "
        f"{g.samples_per_s_spread_pct:.0f}% of the mean (over {limit:.0f}%): noise or drift, not "
        "the mode, may decide comparisons; re-measure with more seeds or on an idle machine."))  # fmt: skip


def _runs_of_status(cases: FindingCases) -> list[Finding]:
    """Runs without numbers (one finding per status and reason), runs with warnings, and
    folders that could not be read or broke the contract."""
    out = []
    for s in cases.statuses:
        n = f"{len(s.run_ids)} runs are" if len(s.run_ids) > 1 else "1 run is"
        out.append(Finding(rule="run_status", severity="bad" if s.status == "failed" else "info",
                           text=f"{n} {s.status}: {s.reason}", run_ids=s.run_ids))  # fmt: skip
    out += [
        Finding(rule="run_warnings", severity="warn", run_ids=[r.run_id],
                text=f"Run {r.run_id}: " + "; ".join(r.warnings))
        for r in cases.warned
    ]  # fmt: skip
    out += [
        Finding(rule="run_status", severity="bad",
                text=f"Folder {s.path} could not be read: {s.reason}")
        for s in cases.skipped
    ]  # fmt: skip
    return out + [
        Finding(rule="run_invalid", severity="bad", text=f"Invalid run: {s.reason}")
        for s in cases.invalid
    ]


def _busy_remedy(b: BusyRun) -> str:
    """What a busy run's figure stands on: its quiet steps, or nothing to trust."""
    if b.quiet_basis:
        return (f"its throughput, {b.run.samples_per_s:.1f} samples/s, is over the "
                f"{b.run.quiet_steps} steps measured while the machine was quiet.")  # fmt: skip
    return "throughput unreliable; re-run with --repeat auto or on an idle machine."


def _info(cases: FindingCases) -> list[Finding]:
    """DP vs DDP throughput, runs without an eval (one per reason), seed spreads, busy runs."""
    frac = THRESHOLDS["busy_other_cores_frac"]
    out = [
        Finding(rule="no_eval", severity="info", run_ids=n.run_ids,
                text=f"No eval in {len(n.run_ids)} run(s), so no accuracy to compare: {n.note}.")
        for n in cases.no_eval
    ]  # fmt: skip
    out += [_seed_spread(g, cases.name_keys) for g in cases.seed_spread]
    return out + [
        Finding(rule="busy_machine", severity="warn", run_ids=[b.run.run_id], text=(
            f"{run_name(b.run)} run {b.run.run_id} was measured while other processes used "
            f"{b.other_cores:.1f} of {b.cores} cores (over {frac:.0%}): " + _busy_remedy(b)))
        for b in cases.busy
    ]  # fmt: skip


def findings(data: dict[str, Any] | RunsJson) -> list[Finding]:
    """All findings for the runs JSON, most important first: scaling, backends, memory, accuracy,
    then runs that produced no numbers."""
    cases = finding_cases(read_runs_json(data))
    multi = cases.name_keys  # name the model / OS in each sentence only when the report mixes
    out = [scaling_finding(c, multi) for c in cases.scaling]
    out += [_backend(b) for b in cases.backends]
    out += [
        Finding(rule="dp_vs_ddp", severity="info", run_ids=[p.dp.run_id, p.ddp.run_id], text=(
            f"{run_name(p.ddp)} ran at {p.ratio:.2f}× the throughput of DP on "
            f"{p.dp.world_size} devices."))
        for p in cases.dp_vs_ddp
    ]  # fmt: skip
    out += [_memory(m, multi) for m in cases.memory]
    out += [_accuracy(a, multi) for a in cases.accuracy]
    return out + _info(cases) + _runs_of_status(cases)
