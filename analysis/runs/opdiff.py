"""`python -m analysis ops RUN` and `python -m analysis diff RUN_A RUN_B`: where a run's step time
goes by operator, and what changed between two runs (e.g. single vs DDP: what DDP adds).

Both work on run entries of the runs JSON (`analysis.runs.entry.load_run` plus the run's analysed
traces), whose per-rank `ops` rows were reduced in the trace workers (analysis/trace/ops.py). Everything
is per analysed step; definitions in docs/reference/metrics.md §9.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from msgspec.structs import asdict

from analysis.runs.entry import load_run
from analysis.runs.fields import one_node_host
from analysis.runs.groups import GroupEntry
from analysis.trace.folder import analyze_trace_dir, find_trace_files
from profiler.runfolder.errors import InputError
from profiler.runfolder.layout import STEP_PHASES
from profiler.runfolder.records import read_record
from profiler.runfolder.versions import DIFF_JSON_SCHEMA_VERSION, OPS_JSON_SCHEMA_VERSION

__all__ = [
    "DdpAdds",
    "ddp_adds",
    "diff_entries",
    "diff_runs",
    "has_ops",
    "load_run_with_traces",
    "run_ops",
]

WORKLOAD_FIELDS = ("workload", "model", "dataset", "scaling", "amp")


class DiffSide(msgspec.Struct, kw_only=True):
    """One side of a diff JSON (the rest of its fields stay in the JSON)."""

    run_id: str = ""
    rank: int | None = None


class DiffStepTimes(msgspec.Struct, kw_only=True):
    """Mean step time of each side and B − A, µs."""

    a: float | None = None
    b: float | None = None
    delta: float | None = None


class DdpAdds(msgspec.Struct, kw_only=True):
    """One "what DDP adds" diff of the runs JSON (`ddp_adds[]`, a diff JSON: A = the single-device
    run, B = DDP rank 0), read typed: its `ops` rows are shown as they are."""

    a: DiffSide = msgspec.field(default_factory=DiffSide)
    b: DiffSide = msgspec.field(default_factory=DiffSide)
    per_sample: bool = False
    step_time_us: DiffStepTimes = msgspec.field(default_factory=DiffStepTimes)
    ops: list[dict[str, Any]] = []
    warnings: list[str] = []


def load_run_with_traces(run: Path) -> dict[str, Any]:
    """The run's runs-JSON entry with its `trace` analysed; one InputError line when the run
    has no traces. RUN may also be a folder of trace files (no run.json)."""
    run, host = Path(run), None
    if (run / "run.json").is_file():
        entry = asdict(load_run(run))  # as in the runs JSON: what diff_entries reads
        trace_dir, host = run / "traces", one_node_host(read_record(run / "run.json")[0])
    elif run.is_dir() and any(run.glob("*/run.json")):
        raise InputError(run, "is a folder of runs", "pass one run folder, e.g. RUNS/<run_id>")
    elif run.is_dir():
        entry = {"run_id": run.name, "path": str(run), "warnings": [], "phases_per_rank_s": []}
        trace_dir = run
    else:
        raise InputError(run, "does not exist", "pass a run folder (runs/<run_id>)")
    try:
        find_trace_files(trace_dir)
    except InputError:
        raise InputError(
            run,
            "has no traces (traces/ is missing or empty)",
            "profile the run (the launcher profiles unless --no-profile) or pick a profiled run",
        ) from None
    entry["trace"] = analyze_trace_dir(trace_dir, progress=False, host=host)
    return entry


def _rank(entry: dict, rank: int) -> dict:
    ranks = {r["rank"]: r for r in entry["trace"]["ranks"]}
    return ranks.get(rank) or ranks[min(ranks)]


def run_ops(run: Path, *, top: int = 30) -> dict[str, Any]:
    """The ops JSON: each rank's `top` operators by self time per analysed step."""
    if top < 1:
        raise InputError("--top", f"must be at least 1 (got {top})", "pass e.g. --top 30")
    entry = load_run_with_traces(run)
    trace = entry["trace"]
    return {
        "schema_version": OPS_JSON_SCHEMA_VERSION,
        "run_id": entry["run_id"],
        "path": entry["path"],
        "kind": trace["kind"],
        "ranks": [
            {
                "rank": r["rank"],
                "steps": r["steps"],
                "step_time_us_mean": r["step_time_us_mean"],
                "self_us_per_step": r["ops_self_us_per_step"],
                "ops": r["ops"][:top],
            }
            for r in trace["ranks"]
        ],
        "warnings": [*entry["warnings"], *trace["warnings"]],
    }


def _batch(entry: dict) -> Any:
    return (
        entry.get("global_batch")
        if entry.get("scaling") == "strong"
        else entry.get("per_device_batch")
    )


def workload_differences(a: dict, b: dict) -> list[str]:
    """What differs between the workloads of two runs (model, dataset, scaling, AMP, and the
    batch that scaling keeps: global for strong, per-device for weak), as `field A vs B`."""
    out = [f"{k} {a.get(k)} vs {b.get(k)}" for k in WORKLOAD_FIELDS if a.get(k) != b.get(k)]
    # A script run's workload (script and arguments) already fixes its problem, whatever batch
    # split it chose per mode.
    scripted = a.get("workload") is not None
    if not scripted and a.get("scaling") == b.get("scaling") and _batch(a) != _batch(b):
        which = "global" if a.get("scaling") == "strong" else "per-device"
        out.append(f"{which} batch {_batch(a)} vs {_batch(b)}")
    return out


def _pct(delta: float, base: float | None) -> float | None:
    return 100 * delta / base if base else None


def _status(in_a: bool, in_b: bool) -> str:
    return "both" if in_a and in_b else ("new" if in_b else "gone")


def _op_rows(ra: dict, rb: dict, per_sample: tuple[int, int] | None) -> list[dict]:
    a = {(o["kind"], o["name"]): o for o in ra["ops"]}
    b = {(o["kind"], o["name"]): o for o in rb["ops"]}
    rows = []
    for key in a.keys() | b.keys():
        oa, ob = a.get(key) or {}, b.get(key) or {}
        sa, sb = oa.get("self_us_per_step", 0.0), ob.get("self_us_per_step", 0.0)
        row = {
            "name": key[1],
            "kind": key[0],
            "calls_per_step_a": oa.get("calls_per_step", 0.0),
            "calls_per_step_b": ob.get("calls_per_step", 0.0),
            "self_us_per_step_a": sa,
            "self_us_per_step_b": sb,
            "delta_us_per_step": sb - sa,
            "delta_pct": _pct(sb - sa, sa),
            "status": _status(key in a, key in b),
        }
        if per_sample:
            row["self_us_per_sample_a"] = sa / per_sample[0]
            row["self_us_per_sample_b"] = sb / per_sample[1]
            row["delta_us_per_sample"] = row["self_us_per_sample_b"] - row["self_us_per_sample_a"]
        rows.append(row)
    rows.sort(key=lambda r: (-abs(r["delta_us_per_step"]), r["name"]))
    return rows


def _phase_rows(a: dict, b: dict, rank_a: int, rank_b: int) -> list[dict]:
    def phases(entry: dict, rank: int) -> dict | None:
        per_rank = {p["rank"]: p for p in entry.get("phases_per_rank_s") or []}
        return per_rank.get(rank) or entry.get("phases_s")

    pa, pb = phases(a, rank_a), phases(b, rank_b)
    if not pa or not pb:
        return []
    rows = []
    for phase in (*STEP_PHASES, "step_time"):
        if pa.get(phase) is None or pb.get(phase) is None:
            continue
        delta = pb[phase] - pa[phase]
        rows.append(
            {
                "phase": phase,
                "a_s": pa[phase],
                "b_s": pb[phase],
                "delta_s": delta,
                "delta_pct": _pct(delta, pa[phase]),
            }
        )
    return rows


def _collective_rows(a: dict, b: dict, ra: dict, rb: dict) -> list[dict]:
    def per_step(entry: dict, r: dict) -> dict:
        n = max(1, r["steps"])
        return {
            c["name"]: (c["calls"] / n, c["latency_us_total"] / n)
            for c in entry["trace"]["collectives_per_rank"]
            if c["rank"] == r["rank"]
        }

    ca, cb = per_step(a, ra), per_step(b, rb)
    rows = []
    for name in sorted(ca.keys() | cb.keys()):
        (na, la), (nb, lb) = ca.get(name, (0.0, 0.0)), cb.get(name, (0.0, 0.0))
        rows.append(
            {
                "name": name,
                "calls_per_step_a": na,
                "calls_per_step_b": nb,
                "latency_us_per_step_a": la,
                "latency_us_per_step_b": lb,
                "delta_us_per_step": lb - la,
                "status": _status(name in ca, name in cb),
            }
        )
    rows.sort(key=lambda r: -abs(r["delta_us_per_step"]))
    return rows


def _side(entry: dict, r: dict) -> dict:
    keys = ("run_id", "path", "mode", "backend", "world_size", "model", "per_device_batch")
    return {
        **{k: entry.get(k) for k in keys},
        "rank": r["rank"],
        "steps": r["steps"],
        "step_time_us_mean": r["step_time_us_mean"],
    }


def diff_entries(a: dict, b: dict, *, rank: int = 0) -> dict[str, Any]:
    """The diff JSON of two run entries that carry `trace` (B relative to A), on `rank` of each
    (a run without that rank uses its lowest rank, with a warning)."""
    ra, rb = _rank(a, rank), _rank(b, rank)
    warnings = [
        f"{e['run_id']}: has no rank {rank} — compared its rank {r['rank']}"
        for e, r in ((a, ra), (b, rb))
        if r["rank"] != rank
    ]
    if differs := workload_differences(a, b):
        warnings.append(
            f"{a['run_id']} and {b['run_id']} run different workloads ({'; '.join(differs)})"
            " — per-operator deltas mix the workload change with the mode change"
        )
    batches = (a.get("per_device_batch"), b.get("per_device_batch"))
    per_sample = batches if all(isinstance(x, int) and x > 0 for x in batches) else None
    if per_sample and batches[0] == batches[1]:
        per_sample = None  # the same samples per step: per step says it all
    return {
        "schema_version": DIFF_JSON_SCHEMA_VERSION,
        "a": _side(a, ra),
        "b": _side(b, rb),
        "per_sample": per_sample is not None,
        "step_time_us": {
            "a": ra["step_time_us_mean"],
            "b": rb["step_time_us_mean"],
            "delta": rb["step_time_us_mean"] - ra["step_time_us_mean"],
        },
        "ops": _op_rows(ra, rb, per_sample),
        "phases": _phase_rows(a, b, ra["rank"], rb["rank"]),
        "collectives": _collective_rows(a, b, ra, rb),
        "warnings": warnings,
    }


def diff_runs(run_a: Path, run_b: Path, *, rank: int = 0) -> dict[str, Any]:
    """The diff JSON of two run folders (B relative to A)."""
    return diff_entries(load_run_with_traces(run_a), load_run_with_traces(run_b), rank=rank)


def has_ops(run: dict[str, Any]) -> bool:
    """An ok run whose analysed traces carry operator rows (what "What DDP adds" compares)."""
    trace = run.get("trace") or {}
    return run.get("status") == "ok" and any(r.get("ops") for r in trace.get("ranks") or [])


def ddp_adds(runs: list[dict], groups: list[GroupEntry]) -> list[dict[str, Any]]:
    """The runs JSON's `ddp_adds`: "what DDP adds", one diff JSON per group of DDP runs.

    Per DDP group (in `groups` order), its first run that has operator rows and whose baseline
    (`baseline_run_id`, §7: same workload, same seed where there is one) has them too, rank 0:
    `diff_entries(baseline, ddp)` (A = the single-device run, B = DDP). Groups without such a
    pair add nothing. Needs the baselines linked and the traces attached."""
    by_id = {r["run_id"]: r for r in runs}
    out = []
    for group in (g for g in groups if (g.strategy or "ddp") == "ddp" and g.mode == "ddp"):
        members = [by_id[rid] for rid in group.run_ids if rid in by_id]
        pairs = [(d, by_id.get(d.get("baseline_run_id"))) for d in members]
        pairs = [(d, s) for d, s in pairs if s and has_ops(d) and has_ops(s)]
        if pairs:
            ddp, single = pairs[0]
            out.append(diff_entries(single, ddp, rank=0))
    return out
