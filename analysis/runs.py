"""Cross-run comparison: speedup, scaling efficiency, phases, memory imbalance, accuracy parity.

Reads run folders only (docs/run-folder.md): `run.json`, `steps.csv` and `traces/`. Every number is
defined in docs/analysis.md; the JSON shape is the "runs JSON" schema there (schema_version 2).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from analysis.comm import is_comm_run
from analysis.errors import AnalysisError, unexpected
from analysis.jsonsafe import finite_json
from analysis.memory import breakdown_entries, fill_dynamic
from analysis.projection_runs import comm_and_projections
from analysis.records import (
    Config,
    EvalEntry,
    InvalidRecord,
    StepTime,
    read_record,
    read_steps,
)
from analysis.tune import is_tune_dir, load_tunes

__all__ = [
    "GROUP_KEY",
    "SCHEMA_VERSION",
    "WORKLOAD_KEY",
    "compare_runs",
    "find_run_dirs",
    "load_run",
    "workload_key",
]

SCHEMA_VERSION = 2
PHASES = ("data", "forward", "backward", "optimizer")
# The config/env fields copied verbatim into each run entry.
CONFIG_FIELDS = (
    "mode",
    "backend",
    "world_size",
    "model",
    "dataset",
    "scaling",
    "global_batch",
    "per_device_batch",
    "seed",
    "amp",
    "devices",
    "sweep_id",
)
ENV_FIELDS = (
    "os",
    "platform",
    "hostname",
    "python",
    "torch",
    "cuda",
    "nccl",
    "gpus",
    "cpu_model",
    "threads_per_rank",
)
# "Same workload": runs that agree on all of these ran the same problem on the same kind of machine,
# so their throughput can be compared or pooled. `fixed_batch` is the batch the scaling mode holds
# fixed (global for strong, per-device for weak); runs from different OSes or device types are
# never pooled. Baselines, groups and findings all use this one key.
WORKLOAD_KEY = ("model", "dataset", "scaling", "fixed_batch", "amp", "device_type", "os")
GROUP_KEY = (*WORKLOAD_KEY, "mode", "backend", "world_size")
GROUP_STATS = (
    "samples_per_s",
    "speedup",
    "scaling_efficiency",
    "test_loss",
    "top1_pct",
    "top5_pct",
)


def find_run_dirs(paths: Sequence[Path]) -> tuple[list[Path], list[dict]]:
    """Expand `paths` (run folders or folders of run folders) into run folders, sorted by name.

    Returns (run_dirs, skipped) where skipped lists {path, reason} for paths holding no run.
    Tune folders (with a tune.json, from `make tune-ddp`) are neither: analysis.tune reads them,
    and their trial run folders are deliberately not expanded into the comparison.
    """
    run_dirs: list[Path] = []
    skipped: list[dict] = []
    for path in map(Path, paths):
        if (path / "run.json").is_file():
            run_dirs.append(path)
        elif is_tune_dir(path):
            continue  # its trials are summarised by the tuning section (analysis.tune), not listed
        elif path.is_dir():
            children = sorted(
                p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")
            )
            found = [p for p in children if (p / "run.json").is_file()]
            tunes = [p for p in children if p not in found and is_tune_dir(p)]
            skipped += [
                {"path": str(p), "reason": "no run.json — not a run folder"}
                for p in children
                if p not in found and p not in tunes
            ]
            if not found and not tunes:
                skipped.append(
                    {
                        "path": str(path),
                        "reason": "no run folders (no */run.json) — "
                        "point at a runs folder written by `python -m workloads.launch`",
                    }
                )
            run_dirs += found
        else:
            skipped.append({"path": str(path), "reason": "does not exist — check the path"})
    return run_dirs, skipped


def _phases(steps: pd.DataFrame) -> tuple[dict | None, list[dict]]:
    """Mean seconds per step of each phase, over all ranks and per rank, on the steps throughput
    uses: neither warm-up nor profiled (schema 1 folders have no `profiled` column: every
    non-warm-up step); falls back to the measured steps, then to every step, rather than nothing."""
    body = steps[steps["warmup"] == 0]
    if "profiled" in steps.columns and (body["profiled"] == 0).any():
        body = body[body["profiled"] == 0]
    if body.empty:  # a run shorter than its warm-up: fall back to every step rather than nothing
        body = steps
    if body.empty:
        return None, []
    cols = [f"{p}_s" for p in PHASES]
    overall = {p: float(body[f"{p}_s"].mean()) for p in PHASES}
    per_rank = body.groupby("rank")[[*cols, "step_time_s"]].mean().reset_index()
    rows = [
        {
            "rank": int(r["rank"]),
            **{p: float(r[f"{p}_s"]) for p in PHASES},
            "step_time": float(r["step_time_s"]),
        }
        for r in per_rank.to_dict("records")
    ]
    return overall, rows


def _memory(entries: list[dict]) -> dict:
    """Peak memory and imbalance over the run's memory entries (one per rank/device).

    Uses `peak_allocated_bytes` (CUDA) when every entry has it, else `peak_rss_bytes` (CPU runs).
    `memory_imbalance_pct` (the one imbalance definition) = (max / min − 1) × 100: how much more
    the fullest device holds than the emptiest. `memory_imbalance_max_over_mean` = max / mean is
    an extra column only.
    """
    out = {
        "memory_metric": None,
        "peak_memory_bytes": None,
        "memory_imbalance_pct": None,
        "memory_imbalance_max_over_mean": None,
    }
    for field in ("peak_allocated_bytes", "peak_rss_bytes"):
        values = [e.get(field) for e in entries]
        if values and all(isinstance(v, int | float) for v in values):
            hi, lo, mean = max(values), min(values), statistics.fmean(values)
            out.update(
                memory_metric=field,
                peak_memory_bytes=int(hi),
                memory_imbalance_pct=(hi / lo - 1) * 100 if lo > 0 else None,
                memory_imbalance_max_over_mean=hi / mean if mean > 0 else None,
            )
            break
    return out


def _device_type(config: Config) -> str | None:
    """`cpu`, `cuda`, ... from the run's first device (`cuda:1` -> `cuda`); None when unknown."""
    return config.devices[0].split(":", 1)[0] if config.devices else None


def workload_key(run: dict) -> tuple:
    """The "same workload" key of a run entry: its WORKLOAD_KEY values."""
    return tuple(run.get(k) for k in WORKLOAD_KEY)


def _num_devices(config: Config) -> int | None:
    """Devices a run spreads over: DDP ranks, DP's GPUs, 1 for single (efficiency's divisor);
    None for a skipped run whose layout was never decided."""
    if config.mode == "dp" and config.devices:
        return len(set(config.devices))
    return config.world_size


def load_run(run_dir: Path) -> dict:
    """One run entry of the runs JSON, without the cross-run fields (baseline, speedup, ...).

    run.json and steps.csv are validated first (analysis/records.py). Raises AnalysisError when
    run.json is missing or unreadable and InvalidRecord when either file breaks the run-folder
    contract; a missing steps.csv (or a bad one in a run that did not finish ok) or bad traces
    only add a line to the entry's `warnings`.
    """
    rec, raw = read_record(run_dir / "run.json")
    config, env, metrics = rec.config, rec.env, rec.metrics
    step_time = metrics.step_time_s or StepTime()
    best = rec.eval.best or EvalEntry()
    memory = (raw.get("metrics") or {}).get("memory") or []
    # The batch the scaling mode holds fixed: part of the same-workload key (WORKLOAD_KEY).
    fixed_batch = config.global_batch if config.scaling == "strong" else config.per_device_batch
    entry: dict[str, Any] = {
        "run_id": rec.run_id or run_dir.name,
        "path": str(run_dir),
        "status": rec.status,
        "error": raw.get("error"),
        **{k: getattr(config, k) for k in CONFIG_FIELDS},
        **{k: getattr(env, k) for k in ENV_FIELDS},
        "fixed_batch": fixed_batch,
        "device_type": _device_type(config),
        "num_devices": _num_devices(config),
        "samples_per_s": metrics.samples_per_s,
        "step_time_s_mean": step_time.mean,
        "step_time_s_p95": step_time.p95,
        "wall_time_s": metrics.wall_time_s,
        "profiler_overhead_pct": metrics.profiler_overhead_pct,
        # Wall time of each epoch's training loop as run (partial when --max-steps cut it).
        "epoch_time_s": _mean_std(metrics.epoch_time_s)[0],
        "baseline_run_id": None,
        "speedup": None,
        "scaling_efficiency": None,
        "phases_s": None,
        "phases_per_rank_s": [],
        "comm_pct": None,
        "exposed_comm_pct": None,
        "overlap_pct": None,
        # Verbatim (validated) entries: fields newer writers add pass through to the report.
        "memory": memory,
        **_memory(memory),
        "memory_breakdown": breakdown_entries((raw.get("metrics") or {}).get("memory_breakdown")),
        "test_loss": best.test_loss,
        "top1_pct": best.top1_pct,
        "top5_pct": best.top5_pct,
        "trace_files": list(rec.traces),
        "logs": sorted(p.relative_to(run_dir).as_posix() for p in run_dir.glob("logs/*.log")),
        "trace": None,
        "warnings": [w for w in rec.warnings if w],  # the writer's own (e.g. no unprofiled step)
    }
    steps_csv = run_dir / "steps.csv"
    if steps_csv.is_file():
        try:
            read_steps(steps_csv)
        except InvalidRecord as err:
            if rec.status == "ok":
                raise
            # A run that did not finish may have been cut off mid-row: its numbers are not used.
            entry["warnings"].append(f"{err} — phases left empty")
        else:  # every cell is now known to be valid: pandas reads the same file into columns
            steps = pd.read_csv(steps_csv)
            entry["phases_s"], entry["phases_per_rank_s"] = _phases(steps)
            if "profiled" not in steps.columns and entry["status"] == "ok":
                entry["warnings"].append(
                    f"{steps_csv}: no `profiled` column (run-folder schema "
                    f"{rec.schema_version}) — throughput and phases include the "
                    "profiled steps; re-run with the current dpscope to exclude them"
                )
    elif entry["status"] == "ok":
        entry["warnings"].append(f"{steps_csv}: missing — phases left empty")
    return entry


def _attach_trace(entry: dict, run_dir: Path, *, progress: bool) -> None:
    """Analyse the run's traces/ folder and copy the run-level trace metrics into `entry`."""
    trace_dir = run_dir / "traces"
    if not trace_dir.is_dir() or not any(trace_dir.iterdir()):
        return
    from analysis.traces import analyze_trace_dir  # only runs with traces need the trace engine

    try:
        trace = analyze_trace_dir(trace_dir, progress=progress)
    except AnalysisError as err:
        entry["warnings"].append(str(err))
        return
    except Exception as err:  # noqa: BLE001 — the run's record stays; only its traces are lost
        entry["warnings"].append(f"{trace_dir}: {unexpected(err)}")
        return
    entry["trace"] = trace
    entry["warnings"] += [f"{s['file']}: {s['reason']}" for s in trace["skipped"]]
    entry["warnings"] += [
        f"{r['file']}: dropped {r['dropped_events']} event(s) with impossible times — not analysed"
        for r in trace["ranks"]
        if r.get("dropped_events")
    ]
    entry["warnings"] += fill_dynamic(entry["memory_breakdown"], trace["ranks"])
    ranks = [r for r in trace["ranks"] if r["step_time_us_mean"]]
    if ranks:
        entry["comm_pct"] = statistics.fmean(
            100 * r["comm_us"] / r["step_time_us_mean"] for r in ranks
        )
        entry["exposed_comm_pct"] = statistics.fmean(
            100 * r["exposed_comm_us"] / r["step_time_us_mean"] for r in ranks
        )
        overlaps = [r["overlap_pct"] for r in ranks if r["overlap_pct"] is not None]
        entry["overlap_pct"] = statistics.fmean(overlaps) if overlaps else None


def _link_baselines(runs: list[dict]) -> None:
    """Fill baseline_run_id, speedup and scaling_efficiency of every ok run."""
    singles = [
        r for r in runs if r["mode"] == "single" and r["status"] == "ok" and r["samples_per_s"]
    ]
    for run in runs:
        if run["status"] != "ok" or not run["samples_per_s"]:
            continue
        # The baseline must have run the same problem on the same kind of machine for the ratio
        # to mean "what parallelism bought".
        same = [s for s in singles if workload_key(s) == workload_key(run)]
        seeded = [s for s in same if s["seed"] == run["seed"]]
        base = (seeded or same or [None])[0]
        if base is None:
            continue
        run["baseline_run_id"] = base["run_id"]
        run["speedup"] = run["samples_per_s"] / base["samples_per_s"]
        run["scaling_efficiency"] = run["speedup"] / run["num_devices"]


def _mean_std(values: Iterable[Any]) -> tuple[float | None, float | None]:
    vals = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)


def _groups(runs: list[dict]) -> list[dict]:
    """Mean ± sample std (n−1) over the seeds of each configuration; only ok runs count."""
    buckets: dict[tuple, list[dict]] = {}
    for run in runs:
        if run["status"] == "ok":
            buckets.setdefault(tuple(run[k] for k in GROUP_KEY), []).append(run)
    groups = []
    for key, members in buckets.items():
        group: dict[str, Any] = dict(zip(GROUP_KEY, key, strict=True))
        group["n_seeds"] = len({m["seed"] for m in members})
        group["n_runs"] = len(members)
        group["run_ids"] = [m["run_id"] for m in members]
        for stat in GROUP_STATS:
            group[f"{stat}_mean"], group[f"{stat}_std"] = _mean_std(m[stat] for m in members)
        group["comm_pct_mean"] = _mean_std(m["comm_pct"] for m in members)[0]
        groups.append(group)
    order = {"single": 0, "dp": 1, "ddp": 2}
    return sorted(
        groups,
        key=lambda g: (
            *(str(g[k]) for k in WORKLOAD_KEY),
            order.get(g["mode"], 9),
            str(g["backend"]),
            g["world_size"] or 0,
        ),
    )


def _unique_id(entry: dict, run_dir: Path, taken: set[str]) -> None:
    """Run ids key baselines, groups and findings, so two folders with one id (the same
    `--run-id` on a Linux and a Windows machine, or a copied folder) must not merge: the later
    one becomes `<id>@<its parent folder>` (then `#2`, `#3`, ...) and says so in `warnings`."""
    rid = str(entry["run_id"])
    if rid not in taken:
        return
    new, n = f"{rid}@{run_dir.parent.name}", 2
    while new in taken:
        new, n = f"{rid}@{run_dir.parent.name}#{n}", n + 1
    entry["run_id"] = new
    entry["warnings"].append(
        f"{run_dir}: run_id {rid!r} is already used by another folder — shown as {new!r}"
    )


def compare_runs(paths: Sequence[Path], *, progress: bool = True, traces: bool = True) -> dict:
    """The runs JSON (schema_version 2) for run folders or folders of run folders in `paths`.

    `traces=False` skips trace analysis (trace fields stay null). Raises AnalysisError only when
    no run could be read at all; unreadable folders are listed under `skipped`.
    """
    run_dirs, skipped = find_run_dirs(paths)
    comm_dirs = [d for d in run_dirs if is_comm_run(d)]  # `make bench-comm`: not a training run
    run_dirs = [d for d in run_dirs if d not in comm_dirs]
    runs = []
    bar = tqdm(
        run_dirs, desc="runs", unit="run", leave=False, disable=not progress or len(run_dirs) < 2
    )
    invalid: list[dict] = []
    for run_dir in bar:
        try:
            entry = load_run(run_dir)
            if traces and entry["status"] == "ok":
                _attach_trace(entry, run_dir, progress=False)  # one bar, over the runs
        except InvalidRecord as err:
            invalid.append({"path": str(run_dir), **err.to_dict()})
            continue
        except AnalysisError as err:
            skipped.append({"path": str(run_dir), "reason": f"{err.what} — {err.fix}"})
            continue
        except Exception as err:  # noqa: BLE001 — one bad run (even a RecursionError or
            # MemoryError) costs one line; the other runs are still compared.
            skipped.append({"path": str(run_dir), "reason": unexpected(err)})
            continue
        _unique_id(entry, run_dir, {r["run_id"] for r in runs})
        runs.append(entry)
    tunes, tune_skipped = load_tunes(paths)
    skipped += tune_skipped
    if not runs and not tunes and not comm_dirs and not invalid:
        where = ", ".join(map(str, paths)) or "(no paths)"
        raise AnalysisError(
            where, "no readable run folders", "run `make profile-all` first or pass the runs folder"
        )
    order = {"single": 0, "dp": 1, "ddp": 2}
    runs.sort(key=lambda r: (order.get(r["mode"], 9), str(r["run_id"])))
    _link_baselines(runs)
    result = {
        "schema_version": SCHEMA_VERSION,
        "runs": runs,
        "groups": _groups(runs),
        "skipped": skipped,
        "tunes": tunes,
        **comm_and_projections(comm_dirs, runs),
        "invalid": invalid,
        "warnings": [],
    }
    return finite_json(result, result["warnings"])
