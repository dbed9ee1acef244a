"""Cross-run comparison: speedup, scaling efficiency, phases, memory imbalance, accuracy parity.

Reads run folders only (docs/reference/run-folder.md): `run.json`, `steps.csv` and `traces/`. Every number is
defined in docs/reference/metrics.md; the JSON shape is the "runs JSON" of docs/reference/schemas.md (schema_version 2).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

import msgspec
from msgspec.structs import asdict

from analysis.errors import unexpected
from analysis.jsonsafe import finite_json
from analysis.progress import Bar
from analysis.project.comm import is_comm_run
from analysis.project.runs import comm_and_projections
from analysis.runs.efficiency import attach_efficiency_loss
from analysis.runs.entry import RunEntry, attach_trace, is_measured, load_run
from analysis.runs.family import family_summary
from analysis.runs.groups import (
    GROUP_KEY,
    MODE_ORDER,
    WORKLOAD_KEY,
    group_runs,
    spread,
    workload_key,
)
from analysis.runs.opdiff import ddp_adds
from analysis.runs.tune import is_tune_dir, load_tunes
from analysis.trace.clocks import check_clock_align
from profiler.runfolder.errors import InputError
from profiler.runfolder.hostload import QUIET_OTHER_CORES_FRAC
from profiler.runfolder.records import InvalidRecord
from profiler.runfolder.versions import RUNS_JSON_SCHEMA_VERSION

__all__ = [
    "GROUP_KEY",
    "WORKLOAD_KEY",
    "compare_runs",
    "find_run_dirs",
    "is_measured",
    "spread",
    "workload_key",
]

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
        same = [s for s in singles if workload_key(s) == workload_key(run)]
        if not same:
            continue
        seeded = [s for s in same if run.seed is not None and s.seed == run.seed]
        # `--repeat` rounds: each run against its own round's single run (the one beside it)
        rounded = [s for s in seeded if (s.repeat_id, s.repeat_round) == (run.repeat_id, run.repeat_round)]  # fmt: skip
        if run.mode == "single":
            kind, base, value = "self", run, run.samples_per_s
        elif seeded:
            base = (rounded or seeded)[0]
            kind, value = "same_seed", base.samples_per_s or 0.0
        else:
            kind, (value, base) = "group_mean", _mean_baseline(same)
        run.baseline_kind, run.baseline_run_id = kind, base.run_id
        run.baseline_run_ids = [s.run_id for s in same] if kind != "same_seed" else [base.run_id]
        run.baseline_samples_per_s = value
        run.baseline_noise_pct = spread(s.samples_per_s for s in same)["samples_per_s_spread_pct"]
        run.speedup = run.samples_per_s / value if value else None
        if run.speedup is not None and run.num_devices:
            run.scaling_efficiency = run.speedup / run.num_devices


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


def _load_runs(
    run_dirs: list[Path],
    invalid: list[dict],
    skipped: list[dict],
    *,
    progress: bool,
    traces: bool,
    clock_align: str,
    quiet_frac: float,
) -> list[RunEntry]:
    """The readable runs of `run_dirs` (their traces analysed when `traces`), each with a unique
    id; an invalid record goes to `invalid`, any other unreadable folder to `skipped`."""
    runs: list[RunEntry] = []
    bar = Bar(
        run_dirs, desc="runs", unit="run", leave=False, disable=not progress or len(run_dirs) < 2
    )
    for run_dir in bar:
        try:
            entry = load_run(run_dir, quiet_frac=quiet_frac)
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
    return runs


def compare_runs(
    paths: Sequence[Path],
    *,
    progress: bool = True,
    traces: bool = True,
    clock_align: str = "auto",
    memory_budget_bytes: int | None = None,
    quiet_frac: float = QUIET_OTHER_CORES_FRAC,
) -> dict:
    """The runs JSON (schema_version 2) for run folders or folders of run folders in `paths`.

    `traces=False` skips trace analysis (trace fields stay null); `clock_align` is the traces
    analysis' (analysis/trace/clocks.py); `memory_budget_bytes` is the per-rank memory the
    family's capacity fits models into (default: the device's memory); `quiet_frac`: the
    quiet-step threshold (other processes' cores per core a run uses; analysis.runs.quiet).
    Raises InputError only when no run could be read at all; unreadable folders are listed
    under `skipped`.
    """
    check_clock_align(clock_align)
    run_dirs, skipped = find_run_dirs(paths)
    comm_dirs = [d for d in run_dirs if is_comm_run(d)]  # `make bench-comm`: not a training run
    run_dirs = [d for d in run_dirs if d not in comm_dirs]
    invalid: list[dict] = []
    runs = _load_runs(run_dirs, invalid, skipped, progress=progress, traces=traces,
                      clock_align=clock_align, quiet_frac=quiet_frac)  # fmt: skip
    tunes, tune_skipped = load_tunes(paths)
    skipped += tune_skipped
    if not runs and not tunes and not comm_dirs and not invalid:
        where = ", ".join(map(str, paths)) or "(no paths)"
        raise InputError(
            where, "no readable run folders", "run `make profile-all` first or pass the runs folder"
        )
    runs.sort(key=lambda r: (MODE_ORDER.get(r.strategy or r.mode, 9), str(r.run_id)))
    _link_baselines(runs)
    groups = group_runs(runs)
    attach_efficiency_loss(runs, groups, workload_key)
    # The JSON edge: the typed entries written out in their field order (analysis.runs.runsjson
    # reads them back typed); the project and opdiff halves read the entries as JSON too.
    rows = [asdict(r) for r in runs]
    result = {
        "schema_version": RUNS_JSON_SCHEMA_VERSION,
        "runs": rows,
        "groups": [asdict(g) for g in groups],
        "ddp_adds": ddp_adds(rows, groups),
        "family": family_summary(rows, WORKLOAD_KEY, memory_budget_bytes),
        "skipped": skipped,
        "tunes": msgspec.to_builtins(tunes),
        **comm_and_projections(comm_dirs, rows),
        "invalid": invalid,
        "warnings": [],
    }
    return finite_json(result, result["warnings"])
