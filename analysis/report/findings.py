"""Plain-language findings: each one comes from a computed rule whose threshold is stated in its text.

Rules read only the runs JSON of `compare_runs`; they never guess. A rule that lacks its inputs
(no baseline, no traces, one device) says nothing rather than something vague.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from analysis.runs.compare import WORKLOAD_KEY, is_measured
from profiler.runfolder.hostload import BUSY_OTHER_CORES_FRAC, is_busy

__all__ = ["Finding", "THRESHOLDS", "findings", "is_busy"]

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

NAMES = {"single": "Single", "dp": "DP", "ddp": "DDP"}


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One sentence for the user; `severity` is good | warn | bad | info; `rule` names the rule."""

    rule: str
    severity: str
    text: str
    run_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_name(run: dict[str, Any], keys: tuple[str, ...] = ()) -> str:
    """'DDP (GLOO)', 'DP', 'Single'; prefixed with the model/OS when the report holds several."""
    mode = NAMES.get(run.get("mode"), str(run.get("mode")))
    backend = run.get("backend")
    name = f"{mode} ({backend.upper()})" if mode == "DDP" and backend else mode
    return " ".join([*(str(run.get(k)) for k in keys), name])


def _runs_of(group: dict[str, Any], runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [runs[r] for r in group.get("run_ids") or [] if r in runs]


def _seeds(members: list[dict[str, Any]]) -> str:
    return f", mean of {len(members)} runs" if len(members) > 1 else ""


def scaling_findings(
    group: dict[str, Any], runs: dict[str, dict[str, Any]], multi: tuple[str, ...]
) -> Finding | None:
    """Speedup and efficiency of one mode/backend/world-size group, plus its exposed comm."""
    speedup, eff = group.get("speedup_mean"), group.get("scaling_efficiency_mean")
    if group.get("mode") == "single" or speedup is None or eff is None:
        return None
    t = THRESHOLDS
    members = _runs_of(group, runs)
    rule = (
        f"≥ {t['efficiency_good'] * 100:.0f}% is good, < {t['efficiency_poor'] * 100:.0f}% is poor"
    )
    if group.get("world_size") == 1:
        # One rank has nothing to scale: its ratio to the single run is DDP's own per-step cost
        # (reducer, bucket copies) plus run-to-run noise, which "where the efficiency went" uses.
        verdict = "one rank: DDP's own cost, no communication"
        rule = "above 1.00× is noise between the runs"
    elif eff > t["efficiency_superlinear"]:
        verdict = "above linear"
        rule = (
            f"over {t['efficiency_superlinear'] * 100:.0f}% usually means the single-device "
            "baseline was slowed, e.g. by oversubscribed threads or a busy machine: re-measure it"
        )
    elif eff >= t["efficiency_good"]:
        verdict = "good scaling"
    elif eff < t["efficiency_poor"]:
        verdict = "poor scaling"
    else:
        verdict = "fair scaling"
    unit = "devices" if group.get("mode") == "dp" else "ranks"
    unit = unit[:-1] if group["world_size"] == 1 else unit
    text = (
        f"{run_name(group, multi)} on {group['world_size']} {unit} reached {speedup:.2f}× vs single "
        f"({eff * 100:.0f}% efficiency{_seeds(members)}: {verdict}; {rule})."
    )
    exposed = [m["exposed_comm_pct"] for m in members if m.get("exposed_comm_pct") is not None]
    if exposed:
        pct = statistics.fmean(exposed)
        word = "allreduce" if group.get("mode") == "ddp" else "communication"
        text += f" {pct:.0f}% of step time is exposed {word}"
        try_ = (group.get("advice") or {}).get(
            "exposed", "try larger buckets, no_sync gradient accumulation or a faster backend"
        )
        text += (
            f" (above the {t['exposed_comm_pct']:.0f}% threshold: {try_})."
            if pct > t["exposed_comm_pct"]
            else f" (within the {t['exposed_comm_pct']:.0f}% threshold)."
        )
    severity = "bad" if speedup < 1 else "good" if verdict == "good scaling" else "warn"
    bases = [runs[b] for m in members if (b := m.get("baseline_run_id")) in runs]
    flagged = sorted({r["run_id"] for r in [*members, *bases] if is_busy(r.get("host_load"))})
    if flagged:
        frac = t["busy_other_cores_frac"]
        text += (
            f" Measured on a busy machine: other processes used over {frac:.0%} of the cores "
            f"during {', '.join(flagged)}, so this speedup is unreliable."
        )
        severity = "bad" if severity == "bad" else "warn"
    return Finding(
        rule="scaling", severity=severity, text=text, run_ids=[m["run_id"] for m in members]
    )


def _busy(runs: list[dict[str, Any]]) -> list[Finding]:
    """One finding per run measured while other processes used much of the machine."""
    frac = THRESHOLDS["busy_other_cores_frac"]
    out = []
    for run in runs:
        if is_busy(load := run.get("host_load")):
            out.append(Finding(rule="busy_machine", severity="warn", run_ids=[run["run_id"]], text=(
                f"{run_name(run)} run {run['run_id']} was measured while other processes used "
                f"{load['other_cpu_cores_mean']:.1f} of {load['cores']} cores (over {frac:.0%}): "
                "throughput unreliable; re-measure on an idle machine.")))  # fmt: skip
    return out


def _seed_spread(groups: list[dict[str, Any]], multi: tuple[str, ...]) -> list[Finding]:
    """Groups whose seeds' throughput spans more than THRESHOLDS["seed_spread_pct"]."""
    limit = THRESHOLDS["seed_spread_pct"]
    out = []
    for g in groups:
        spread = g.get("samples_per_s_spread_pct")
        if spread is None or spread <= limit:
            continue
        out.append(Finding(rule="seed_spread", severity="warn", run_ids=list(g["run_ids"]), text=(
            f"{run_name(g, multi)} at {g['world_size']}: its {g['n_runs']} runs' throughput spans "
            f"{g['samples_per_s_min']:.1f}–{g['samples_per_s_max']:.1f} samples/s, a spread of "
            f"{spread:.0f}% of the mean (over {limit:.0f}%): noise or drift, not the mode, may "
            "decide comparisons; re-measure with more seeds or on an idle machine.")))  # fmt: skip
    return out


def _imbalance(run: dict[str, Any]) -> tuple[float, dict, dict] | None:
    """(the run's `memory_imbalance_pct`, fullest entry, emptiest entry) for one run: the number
    is compare_runs' own, the entries only name the devices."""
    metric = run.get("memory_metric")
    pct = run.get("memory_imbalance_pct")
    entries = [m for m in run.get("memory") or [] if isinstance(m.get(metric), int | float)]
    if pct is None or len(entries) < 2:
        return None
    hi = max(entries, key=lambda m: m[metric])
    lo = min(entries, key=lambda m: m[metric])
    return pct, hi, lo


def _memory(
    group: dict[str, Any], runs: dict[str, dict[str, Any]], multi: tuple[str, ...]
) -> Finding | None:
    """Memory balance across the devices/ranks of a group's runs (its worst run speaks)."""
    scored = [(imb, m) for m in _runs_of(group, runs) if (imb := _imbalance(m))]
    if not scored:
        return None
    (pct, hi, lo), run = max(scored, key=lambda x: x[0][0])
    limit = THRESHOLDS["memory_imbalance_pct"]
    what = "peak RSS" if run.get("memory_metric") == "peak_rss_bytes" else "peak allocated"
    dp = run.get("mode") == "dp"
    worst = f", worst of {len(scored)} runs" if len(scored) > 1 else ""

    def where(m: dict[str, Any]) -> str:
        return f"{m.get('device')}" if dp else f"rank {m.get('rank')} ({m.get('device')})"

    ids = [m["run_id"] for _, m in scored]
    if pct < limit:
        text = (
            f"{run_name(run, multi)} on {run['world_size']} {'devices' if dp else 'ranks'}: memory is "
            f"balanced ({what} differs by {pct:.0f}%{worst}; the threshold is {limit:.0f}%)."
        )
        return Finding(rule="memory", severity="good", text=text, run_ids=ids)
    text = (
        f"{run_name(run, multi)} holds {pct:.0f}% more memory on {where(hi)} than on {where(lo)} "
        f"({what}{worst}; imbalance threshold {limit:.0f}%)."
    )
    return Finding(rule="memory", severity="warn", text=text, run_ids=ids)


def _accuracy(groups: list[dict[str, Any]], multi: tuple[str, ...]) -> list[Finding]:
    out = []
    key = WORKLOAD_KEY
    singles = {tuple(g.get(k) for k in key): g for g in groups if g.get("mode") == "single"}
    limit = THRESHOLDS["accuracy_drop_pp"]
    for g in groups:
        base = singles.get(tuple(g.get(k) for k in key))
        if g.get("mode") == "single" or base is None:
            continue
        a, b = g.get("top1_pct_mean"), base.get("top1_pct_mean")
        if a is None or b is None:
            continue
        name = run_name(g, multi)
        unit = "devices" if g.get("mode") == "dp" else "ranks"
        ids = [*(g.get("run_ids") or []), *(base.get("run_ids") or [])]
        if b - a > limit:
            text = (
                f"{name} on {g['world_size']} {unit} lost accuracy vs single: top-1 {a:.1f}% vs "
                f"{b:.1f}% (a drop over {limit:.0f} pp): consider SyncBatchNorm / lr scaling."
            )
            out.append(Finding(rule="accuracy", severity="bad", text=text, run_ids=ids))
        else:
            text = (
                f"{name} on {g['world_size']} {unit} held accuracy: top-1 {a:.1f}% vs {b:.1f}% "
                f"single (within {limit:.0f} pp)."
            )
            out.append(Finding(rule="accuracy", severity="good", text=text, run_ids=ids))
    return out


def _no_eval(runs: list[dict[str, Any]]) -> list[Finding]:
    """Runs without an eval (a dataset without a test split) say so, rather than showing no
    accuracy without a reason; one finding per reason."""
    by_note: dict[str, list[str]] = {}
    for run in runs:
        if run.get("eval_note"):
            by_note.setdefault(str(run["eval_note"]), []).append(str(run["run_id"]))
    return [
        Finding(
            rule="no_eval",
            severity="info",
            text=f"No eval in {len(ids)} run(s), so no accuracy to compare: {note}.",
            run_ids=ids,
        )
        for note, ids in by_note.items()
    ]


def _backends(groups: list[dict[str, Any]]) -> list[Finding]:
    out = []
    key = (*WORKLOAD_KEY, "world_size")
    by_key: dict[tuple, dict[str, dict[str, Any]]] = {}
    for g in groups:
        if g.get("mode") == "ddp" and g.get("samples_per_s_mean"):
            by_key.setdefault(tuple(g.get(k) for k in key), {})[g["backend"]] = g
    for found in by_key.values():
        if {"nccl", "gloo"} <= found.keys():
            n, gl = found["nccl"]["samples_per_s_mean"], found["gloo"]["samples_per_s_mean"]
            fast, slow, ratio = ("NCCL", "GLOO", n / gl) if n >= gl else ("GLOO", "NCCL", gl / n)
            limit = THRESHOLDS["backend_ratio"]
            if ratio >= limit:
                text = f"Backends: {fast} {ratio:.1f}× faster than {slow} on the same run"
            else:
                text = "Backends: NCCL and GLOO throughput are a tie on the same run"
            g = found["nccl"]
            text += (
                f" ({g['model']}, {g['world_size']} ranks, {g['os']}; differences under "
                f"{(limit - 1) * 100:.0f}% count as a tie)."
            )
            ids = [*found["nccl"].get("run_ids", []), *found["gloo"].get("run_ids", [])]
            out.append(Finding(rule="backends", severity="info", text=text, run_ids=ids))
    return out


def _dp_vs_ddp(runs: list[dict[str, Any]]) -> list[Finding]:
    out = []
    ok = [r for r in runs if is_measured(r) and r.get("samples_per_s")]
    for dp in (r for r in ok if r.get("mode") == "dp"):
        for ddp in (r for r in ok if r.get("mode") == "ddp"):
            same = all(dp.get(k) == ddp.get(k) for k in (*WORKLOAD_KEY, "world_size", "seed"))
            if same:
                ratio = ddp["samples_per_s"] / dp["samples_per_s"]
                text = (
                    f"{run_name(ddp)} ran at {ratio:.2f}× the throughput of DP on "
                    f"{dp['world_size']} devices."
                )
                out.append(
                    Finding(
                        rule="dp_vs_ddp",
                        severity="info",
                        text=text,
                        run_ids=[dp["run_id"], ddp["run_id"]],
                    )
                )
    return out


def _failures(data: dict[str, Any]) -> list[Finding]:
    """Runs without numbers, one finding per distinct status and reason."""
    by_reason: dict[tuple[str, str], list[str]] = {}
    for r in data.get("runs", []):
        if r.get("status") != "ok":
            err = r.get("error")
            why = (err.get("message") if isinstance(err, dict) else err) or "no reason recorded"
            if isinstance(err, dict) and err.get("kind"):  # error.kind: crash, killed, oom, ...
                why = f"{err['kind']}: {why}"
            by_reason.setdefault((str(r.get("status")), str(why)), []).append(r["run_id"])
    out = []
    for (status, why), ids in by_reason.items():
        n = f"{len(ids)} runs are" if len(ids) > 1 else "1 run is"
        severity = "bad" if status == "failed" else "info"
        out.append(
            Finding(rule="run_status", severity=severity, text=f"{n} {status}: {why}", run_ids=ids)
        )
    for r in data.get("runs", []):
        if is_measured(r) and r.get("warnings"):
            text = f"Run {r['run_id']}: " + "; ".join(r["warnings"])
            out.append(
                Finding(rule="run_warnings", severity="warn", text=text, run_ids=[r["run_id"]])
            )
    for s in data.get("skipped", []):
        out.append(
            Finding(
                rule="run_status",
                severity="bad",
                text=f"Folder {s['path']} could not be read: {s['reason']}",
            )
        )
    for s in data.get("invalid", []):
        out.append(Finding(rule="run_invalid", severity="bad", text=f"Invalid run: {s['reason']}"))
    return out


def findings(data: dict[str, Any]) -> list[Finding]:
    """All findings for the runs JSON, most important first: scaling, backends, memory, accuracy,
    then runs that produced no numbers."""
    runs = {r["run_id"]: r for r in data.get("runs", []) if is_measured(r)}
    groups = data.get("groups", [])
    # Name the model / OS in each sentence only when the report mixes several.
    multi = tuple(k for k in ("model", "os") if len({g.get(k) for g in groups}) > 1)
    out = [f for g in groups if (f := scaling_findings(g, runs, multi))]
    out += _backends(groups)
    out += _dp_vs_ddp(list(runs.values()))
    out += [f for g in groups if (f := _memory(g, runs, multi))]
    out += _accuracy(groups, multi)
    out += _no_eval(list(runs.values()))
    out += _seed_spread(groups, multi)
    out += _busy(list(runs.values()))
    return out + _failures(data)
