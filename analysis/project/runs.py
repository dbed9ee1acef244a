"""The runs JSON's `comm` and `projections` entries: comm benchmark folders found among the runs,
and one scaling projection per (comm run, workload) for the report's Projection section.

For each ok comm run and each workload (model, dataset, scaling, amp) with an ok training run, the
source is the workload's first run when that is a single-device run, else its first DDP run on
the comm run's backend; the other DDP runs of that workload on that backend are the measured
points, and every DDP run is replayed from itself. The source's other runs at its per-device batch
are its workload runs: those of its mode and world size (other seeds) widen the compute band, and
a single-device source takes its compute at n ≥ 2 from the first 1-rank DDP run. World sizes:
powers of 2 up to 1,024 plus every measured n, with the defaults of `analysis project` (8 ranks
per node, 100 Gb/s between nodes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from analysis.project.comm import load_comm_run
from analysis.project.projection import project
from analysis.project.sharded import project_sharded
from analysis.runs.family import SHARDED
from profiler.runfolder.errors import InputError

__all__ = ["REPORT_RANKS", "comm_and_projections"]

REPORT_RANKS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
FINDING_RANKS = 64


def _workload(run: dict) -> tuple:
    return run["model"], run["dataset"], run["scaling"], run["amp"]


def _workload_runs(source: dict, group: list[dict]) -> list[Path]:
    """The source's seed runs (its mode, world size and per-device batch) and, for a
    single-device source, the first 1-rank DDP run at its batch (DDP's own per-step cost)."""
    same = [r for r in group if r is not source and r.get("per_device_batch") == source.get(
        "per_device_batch")]  # fmt: skip
    seeds = [r for r in same if (r["mode"], r["world_size"]) == (source["mode"],
                                                                  source["world_size"])]  # fmt: skip
    ddp1 = [r for r in same if r["mode"] == "ddp" and r["world_size"] == 1]
    extra = ddp1[:1] if source["mode"] == "single" else []
    return [Path(r["path"]) for r in seeds + extra]


def _fp16_share(run_dir: Path, comm_dir: Path, result: dict) -> float | None:
    """Exposed share of the step at FINDING_RANKS if the gradients travelled as fp16."""
    if result["inputs"]["wire_bytes_factor"] != 1.0:
        return None
    half = project(
        run_dir,
        comm_dir,
        [FINDING_RANKS],
        scaling=result["scaling"],
        traces=False,
        wire_bytes_factor=0.5,
    )
    return half["predictions"][0]["exposed_comm_pct"]


def _plain(obj: Any) -> Any:
    """`obj` with numpy scalars as Python numbers (the same values): the runs JSON holds JSON
    values only, so it reads back typed (analysis.runs.runsjson) exactly as it is written."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj.item() if isinstance(obj, np.generic) else obj


def _replays(ddp: list[dict], comm_path: Path, skipped: list[dict]) -> list[dict]:
    """Each DDP run of a workload projected from itself at its own world size (the replay
    check); a run that cannot be is one line in `skipped`."""
    out = []
    for r in ddp:
        try:
            # its traces read again (when the runs JSON read them at all): the self-replay
            # needs their per-bucket calls, which the traces JSON lacks
            own = project(
                Path(r["path"]), comm_path, [r["world_size"]], traces=r.get("trace") is not None
            )
        except (InputError, ValueError, KeyError, TypeError) as err:
            skipped.append({"path": r["path"], "reason": str(err)})
            continue
        out.append({**own["replay"], "traced": own["replay_traced"], "warnings": own["warnings"]})
    return out


def comm_and_projections(comm_dirs: list[Path], runs: list[dict]) -> dict:
    """{comm: [...], projections: [...], projection_skipped: [...]} for the runs JSON.

    Each projection also gets `replays`: every DDP run of the workload projected from itself at
    its own world size (the replay check), and `fp16_exposed_comm_pct` (see _fp16_share)."""
    comm, skipped, projections = [], [], []
    for d in comm_dirs:
        try:
            comm.append(load_comm_run(d))
        except InputError as err:
            skipped.append({"path": str(d), "reason": str(err)})
    ok = [r for r in runs if r.get("status") == "ok" and r.get("strategy") in ("single", "ddp")]
    for c in (c for c in comm if c["status"] == "ok"):
        same = [r for r in ok if r["mode"] == "single" or r["backend"] == c["backend"]]
        for key in dict.fromkeys(_workload(r) for r in same):
            group = [r for r in same if _workload(r) == key]
            ddp = [r for r in group if r["mode"] == "ddp"]
            source = group[0] if group[0]["mode"] == "single" else ddp[0]
            ranks = sorted(set(REPORT_RANKS) | {int(r["world_size"] or 1) for r in ddp})
            measured = [Path(r["path"]) for r in ddp if r is not source]
            try:
                result = project(
                    Path(source["path"]),
                    Path(c["path"]),
                    ranks,
                    measured=measured,
                    workload_runs=_workload_runs(source, group),
                )
                result["fp16_exposed_comm_pct"] = _fp16_share(
                    Path(source["path"]), Path(c["path"]), result
                )
            except (
                InputError,
                ValueError,
                KeyError,
                TypeError,
            ) as err:  # one bad input, one line
                skipped.append({"path": source["path"], "reason": str(err)})
                continue
            result["replays"] = _replays(ddp, Path(c["path"]), skipped)
            result["comm_path"] = c["path"]
            projections.append(result)
    for c in (c for c in comm if c["status"] == "ok"):
        projections += _sharded(c, runs, skipped)
    return _plain({"comm": comm, "projections": projections, "projection_skipped": skipped})


def _traces(run: dict) -> bool | dict:
    """The run's traces JSON when the runs JSON analysed them (not read again), else False."""
    return run.get("trace") or False


def _sharded(comm: dict, runs: list[dict], skipped: list[dict]) -> list[dict]:
    """One projection per workload and sharded strategy (ZeRO-1, FSDP2) on the comm run's
    backend, from its first run, the others as measured points, each replayed from itself."""
    ok = [r for r in runs if r.get("status") == "ok" and r.get("strategy") in SHARDED
          and r.get("backend") == comm["backend"]]  # fmt: skip
    out = []
    for key in dict.fromkeys((*_workload(r), r["strategy"]) for r in ok):
        group = [r for r in ok if (*_workload(r), r["strategy"]) == key]
        source = group[0]
        ranks = sorted(set(REPORT_RANKS) | {int(r["world_size"] or 1) for r in group})
        try:
            result = project_sharded(
                Path(source["path"]), Path(comm["path"]), ranks,
                measured=[Path(r["path"]) for r in group[1:]], traces=_traces(source),
            )  # fmt: skip
            result["replays"] = []
            for r in group:
                own = project_sharded(Path(r["path"]), Path(comm["path"]), [r["world_size"]],
                                      traces=_traces(r))  # fmt: skip
                result["replays"].append(
                    {**own["replay"], "traced": None, "warnings": own["warnings"]}
                )
        except (InputError, ValueError, KeyError, TypeError) as err:  # one bad input, one line
            skipped.append({"path": source["path"], "reason": str(err)})
            continue
        result.update(comm_path=comm["path"], strategy=key[-1], fp16_exposed_comm_pct=None)
        out.append(result)
    return out
