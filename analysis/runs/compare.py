"""Cross-run comparison: speedup, scaling efficiency, phases, memory imbalance, accuracy parity.

Reads run folders only (docs/reference/run-folder.md): `run.json`, `steps.csv` and `traces/`. Every number is
defined in docs/reference/metrics.md; the JSON shape is the "runs JSON" of docs/reference/schemas.md (schema_version 2).
"""

from __future__ import annotations

import statistics
from profiler.runfolder.versions import RUNS_JSON_SCHEMA_VERSION
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from msgspec.structs import asdict
from tqdm import tqdm

from profiler.runfolder.errors import InputError
from analysis.errors import unexpected
from analysis.jsonsafe import finite_json
from analysis.project.comm import is_comm_run
from analysis.project.runs import comm_and_projections
from analysis.runs.efficiency import attach_efficiency_loss
from analysis.runs.entry import RunEntry, attach_trace, is_measured, load_run, mean_std
from analysis.trace.clocks import check_clock_align
from analysis.runs.opdiff import ddp_adds
from profiler.runfolder.records import InvalidRecord
from analysis.runs.tune import is_tune_dir, load_tunes

__all__ = [
    "GROUP_KEY",
    "WORKLOAD_KEY",
    "compare_runs",
    "find_run_dirs",
    "is_measured",
    "workload_key",
]

# "Same workload": runs that agree on all of these ran the same problem on the same kind of machine,
# so their throughput can be compared or pooled. `model`, `dataset` and `loss` are the spec strings
# as given (a user's `mypkg.nets:build` pairs with itself), with the factories' arguments
# (entry.args_text); `fixed_batch` is the batch the scaling mode holds fixed (global for strong,
# per-device for weak); runs from different OSes or device types are never pooled; a script
# run's `workload` (its script's hash and arguments, or --workload) stands for the problem it
# ran. Baselines, groups and findings all use this one key.
WORKLOAD_KEY = (
    "workload",
    "model",
    "model_args",
    "dataset",
    "dataset_args",
    "loss",
    "scaling",
    "fixed_batch",
    "amp",
    "device_type",
    "os",
)
GROUP_KEY = (*WORKLOAD_KEY, "mode", "backend", "world_size")
GROUP_STATS = (
    "samples_per_s",
    "speedup",
    "scaling_efficiency",
    "test_loss",
    "top1_pct",
    "top5_pct",
    "perplexity",
)


def find_run_dirs(paths: Sequence[Path]) -> tuple[list[Path], list[dict]]:
    """Expand `paths` (run folders or folders of run folders) into run folders, sorted by name.

    Returns (run_dirs, skipped) where skipped lists {path, reason} for paths holding no run.
    Tune folders (with a tune.json, from `make tune-ddp`) are neither: analysis.runs.tune reads them,
    and their trial run folders are deliberately not expanded into the comparison.
    """
    run_dirs: list[Path] = []
    skipped: list[dict] = []
    for path in map(Path, paths):
        if (path / "run.json").is_file():
            run_dirs.append(path)
        elif is_tune_dir(path):
            continue  # its trials are summarised by the tuning section (analysis.runs.tune), not listed
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


def workload_key(run: dict) -> tuple:
    """The "same workload" key of a run entry: its WORKLOAD_KEY values."""
    return tuple(run.get(k) for k in WORKLOAD_KEY)


def _workload(run: RunEntry) -> tuple:
    return tuple(getattr(run, k) for k in WORKLOAD_KEY)


def _mean_baseline(same: list[RunEntry]) -> tuple[float, RunEntry]:
    """(mean samples/s of the single runs `same`, the one closest to that mean)."""
    mean = statistics.fmean(s.samples_per_s or 0.0 for s in same)
    return mean, min(same, key=lambda s: (abs((s.samples_per_s or 0.0) - mean), s.run_id))


def _link_baselines(runs: list[RunEntry]) -> None:
    """Fill the baseline fields, speedup and scaling_efficiency of every measured run
    (docs/reference/metrics.md §7, "Baselines"):

    - a run with a seed and a single run of the same workload and seed: that run
      (`baseline_kind` `same_seed`);
    - otherwise (no seed, as a script run has, or no single run with its seed): the mean
      throughput of the workload's single runs (`group_mean`); `baseline_run_id` names the one
      closest to that mean (the run memory, operators and the efficiency split compare with);
    - a single run: speedup 1 by definition (`self`): the spread of the single runs is the
      noise, not a speedup.

    `baseline_samples_per_s` is what the speedup divides by, `baseline_run_ids` the single runs
    it comes from, and `baseline_noise_pct` their throughput's spread, (max − min) ÷ mean × 100
    (None with one single run): a speedup closer to 1 than that is noise."""
    singles = [r for r in runs if r.mode == "single" and is_measured(r) and r.samples_per_s]
    for run in runs:
        if not is_measured(run) or not run.samples_per_s:
            continue
        # The baseline must have run the same problem on the same kind of machine for the ratio
        # to mean "what parallelism bought".
        same = [s for s in singles if _workload(s) == _workload(run)]
        if not same:
            continue
        seeded = [s for s in same if run.seed is not None and s.seed == run.seed]
        if run.mode == "single":
            kind, base, value = "self", run, run.samples_per_s
        elif seeded:
            kind, base, value = "same_seed", seeded[0], seeded[0].samples_per_s or 0.0
        else:
            kind, (value, base) = "group_mean", _mean_baseline(same)
        run.baseline_kind, run.baseline_run_id = kind, base.run_id
        run.baseline_run_ids = [s.run_id for s in same] if kind != "same_seed" else [base.run_id]
        run.baseline_samples_per_s = value
        run.baseline_noise_pct = spread(s.samples_per_s for s in same)["samples_per_s_spread_pct"]
        run.speedup = run.samples_per_s / value if value else None
        if run.speedup is not None and run.num_devices:
            run.scaling_efficiency = run.speedup / run.num_devices


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


def _groups(runs: list[RunEntry]) -> list[dict]:
    """Mean ± sample std (n−1) over the seeds of each configuration; only measured runs (ok or
    interrupted, is_measured) count."""
    buckets: dict[tuple, list[RunEntry]] = {}
    for run in runs:
        if is_measured(run):
            buckets.setdefault(tuple(getattr(run, k) for k in GROUP_KEY), []).append(run)
    groups = []
    for key, members in buckets.items():
        group: dict[str, Any] = dict(zip(GROUP_KEY, key, strict=True))
        group["n_seeds"] = len({m.seed for m in members})
        group["n_runs"] = len(members)
        group["run_ids"] = [m.run_id for m in members]
        # What the group's runs share: their caption, script, advice and baseline's noise.
        first = members[0]
        group["workload_label"], group["script"] = first.workload_label, first.script
        group["advice"] = first.advice
        group["baseline_noise_pct"] = first.baseline_noise_pct
        for stat in GROUP_STATS:
            group[f"{stat}_mean"], group[f"{stat}_std"] = mean_std(
                getattr(m, stat) for m in members
            )
        group["comm_pct_mean"] = mean_std(m.comm_pct for m in members)[0]
        group["exposed_comm_pct_mean"] = mean_std(m.exposed_comm_pct for m in members)[0]
        group.update(spread(m.samples_per_s for m in members))
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


def _unique_id(entry: RunEntry, run_dir: Path, taken: set[str]) -> None:
    """Run ids key baselines, groups and findings, so two folders with one id (the same
    `--run-id` on a Linux and a Windows machine, or a copied folder) must not merge: the later
    one becomes `<id>@<its parent folder>` (then `#2`, `#3`, ...) and says so in `warnings`."""
    rid = str(entry.run_id)
    if rid not in taken:
        return
    new, n = f"{rid}@{run_dir.parent.name}", 2
    while new in taken:
        new, n = f"{rid}@{run_dir.parent.name}#{n}", n + 1
    entry.run_id = new
    entry.warnings.append(
        f"{run_dir}: run_id {rid!r} is already used by another folder — shown as {new!r}"
    )


def compare_runs(
    paths: Sequence[Path], *, progress: bool = True, traces: bool = True, clock_align: str = "auto"
) -> dict:
    """The runs JSON (schema_version 2) for run folders or folders of run folders in `paths`.

    `traces=False` skips trace analysis (trace fields stay null); `clock_align` is the traces
    analysis' (analysis/trace/clocks.py). Raises InputError only when no run could be read at
    all; unreadable folders are listed under `skipped`.
    """
    check_clock_align(clock_align)
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
            if traces and is_measured(entry):
                # one bar, over the runs
                attach_trace(entry, run_dir, progress=False, clock_align=clock_align)
        except InvalidRecord as err:
            invalid.append({"path": str(run_dir), **err.to_dict()})
            continue
        except InputError as err:
            skipped.append({"path": str(run_dir), "reason": f"{err.what} — {err.fix}"})
            continue
        except Exception as err:  # noqa: BLE001 — one bad run (even a RecursionError or
            # MemoryError) costs one line; the other runs are still compared.
            skipped.append({"path": str(run_dir), "reason": unexpected(err)})
            continue
        _unique_id(entry, run_dir, {r.run_id for r in runs})
        runs.append(entry)
    tunes, tune_skipped = load_tunes(paths)
    skipped += tune_skipped
    if not runs and not tunes and not comm_dirs and not invalid:
        where = ", ".join(map(str, paths)) or "(no paths)"
        raise InputError(
            where, "no readable run folders", "run `make profile-all` first or pass the runs folder"
        )
    order = {"single": 0, "dp": 1, "ddp": 2}
    runs.sort(key=lambda r: (order.get(r.mode, 9), str(r.run_id)))
    _link_baselines(runs)
    groups = _groups(runs)
    attach_efficiency_loss(runs, groups, _workload)
    rows = [asdict(r) for r in runs]  # the runs JSON's entries: dicts, in RunEntry's field order
    result = {
        "schema_version": RUNS_JSON_SCHEMA_VERSION,
        "runs": rows,
        "groups": groups,
        "ddp_adds": ddp_adds(rows, groups),
        "skipped": skipped,
        "tunes": tunes,
        **comm_and_projections(comm_dirs, rows),
        "invalid": invalid,
        "warnings": [],
    }
    return finite_json(result, result["warnings"])
