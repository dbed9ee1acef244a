"""Rank parts: what each rank of a recorded run writes at its exit, and their assembly into the
standard run folder (docs/reference/run-folder.md).

A RunRecorder (profiler.recorder; the zero-code `--script` bootstrap uses one too) never needs a
collective at the end: each rank writes `logs/rank<r>.part.json` itself, also after the script
destroyed its process group, and whoever assembles (rank 0 of an in-process recorder, or the
launcher after a `--script` run) reads the parts and writes steps.csv and run.json.

Torch-free: the launcher assembles without importing what the ranks ran.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from profiler.runfolder.atomic import write_json_atomic
from profiler.runfolder.layout import utc_now, write_run_json, write_steps_csv
from profiler.runfolder.schema import PROCESS_GROUP_MODES
from profiler.runfolder.stepmetrics import step_metrics
from profiler.runfolder.versions import RUN_JSON_SCHEMA_VERSION

__all__ = [
    "NO_PROCESS_GROUP_WARNING",
    "NO_STEP_WARNING",
    "assemble",
    "part_path",
    "read_parts",
    "recorded_config",
    "wait_for_parts",
    "write_part",
]

NO_STEP_WARNING = (
    "no optimizer step was seen: steps.csv is empty and throughput is unknown; dpscope counts a "
    "step at each optimizer.step() (see docs/guides/own-script.md)"
)
NO_PROCESS_GROUP_WARNING = (
    "{n} processes were started with WORLD_SIZE={n} but none joined a process group: each "
    "trained alone, so the run is recorded as single-device from rank 0's process only (does "
    "the script call torch.distributed.init_process_group when WORLD_SIZE is set?)"
)


def part_path(run_dir: Path, rank: int) -> Path:
    """`logs/rank<r>.part.json`: one rank's part."""
    return Path(run_dir) / "logs" / f"rank{rank}.part.json"


def write_part(run_dir: Path, part: dict) -> Path:
    """Write one rank's part atomically; return its path."""
    path = part_path(run_dir, int(part["rank"]))
    write_json_atomic(path, part)
    return path


def read_parts(run_dir: Path) -> list[dict]:
    """Every rank part in the run folder, by rank (an unreadable one is left out: its rank
    failed while writing and the run's error says so)."""
    parts = []
    for path in sorted((Path(run_dir) / "logs").glob("rank*.part.json")):
        try:
            parts.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return sorted(parts, key=lambda p: p["rank"])


def wait_for_parts(run_dir: Path, world_size: int, *, timeout_s: float) -> list[dict]:
    """The parts of all `world_size` ranks, or those there after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while len(parts := read_parts(run_dir)) < world_size and time.monotonic() < deadline:
        time.sleep(0.2)
    return parts


def _most_common(values: list[int]) -> int | None:
    return Counter(values).most_common(1)[0][0] if values else None


def recorded_config(parts: list[dict], *, profile: dict, warmup_steps: int) -> dict:
    """run.json `config` of a recorded run: the mode, world and devices the ranks saw, the model
    they trained, and the samples per step (the most common per rank and summed over ranks)."""
    first = parts[0]
    rows = [r for p in parts for r in p["rows"]]
    per_step: dict[int, int] = {}
    for r in rows:
        per_step[r["step"]] = per_step.get(r["step"], 0) + (r["samples"] or 0)
    return {
        "mode": first["mode"],
        "backend": first["backend"],
        "world_size": first["world_size"],
        "nnodes": 1,
        "nproc_per_node": len(parts) if first["mode"] in PROCESS_GROUP_MODES else 1,
        "devices": [d for p in parts for d in p["devices"]],
        "model": first["model"],
        "param_count": first["param_count"],
        "dataset": None,
        "global_batch": _most_common(list(per_step.values())) or None,
        "per_device_batch": _most_common([r["samples"] for r in first["rows"] if r["samples"]]),
        "grad_accum_steps": _most_common(first["micro_batches"]) or 1,
        "scaling": None,
        "amp": None,
        "seed": None,
        "warmup_steps": warmup_steps,
        "profile": profile,
        "workload": first.get("workload"),
        "zero": first.get("zero"),
        "fsdp": first.get("fsdp_config"),
    }


def _metrics(parts: list[dict], rows: list[dict], *, wall_time_s: float | None) -> dict:
    active = {(p["rank"], s) for p in parts for s in p["active_steps"]}
    metrics = step_metrics(rows, active)
    first = parts[0]
    return {
        **metrics,
        "epoch_time_s": [],
        # rank 0's time from its recorder's creation (the bootstrap: the script's start) to its end
        "wall_time_s": first.get("wall_time_s") if wall_time_s is None else wall_time_s,
        "memory": [m for p in parts for m in p["memory"]],
        "memory_after_first_step": [m for p in parts for m in p["memory_after_first_step"]],
        "memory_breakdown": [m for p in parts for m in p["memory_breakdown"]],
        "ddp": first.get("ddp"),
        "fsdp": first.get("fsdp"),
        "param_grad_bytes": first.get("param_grad_bytes", []),
        "buffer_bytes_by_dtype": first.get("buffer_bytes_by_dtype", {}),
    }


def assemble(
    run_dir: Path,
    parts: list[dict],
    *,
    run_id: str,
    status: str,
    profile: dict,
    warmup_steps: int,
    config_extra: dict | None = None,
    created_at: str | None = None,
    error: dict | None = None,
    wall_time_s: float | None = None,
) -> dict:
    """Write steps.csv and run.json from the ranks' `parts`; return the record. `config` is
    `recorded_config` plus `config_extra` (a script run's path, arguments and hash).

    A part whose process saw no process group under a multi-process launch keeps only rank 0's
    (every process trained alone; see NO_PROCESS_GROUP_WARNING)."""
    warnings: list[str] = []
    launched = max(len(parts), int(parts[0].get("env_world_size", 1)))
    if launched > 1 and not any(p["pg_seen"] for p in parts):
        parts = [p for p in parts if p["rank"] == 0] or parts[:1]
        warnings.append(NO_PROCESS_GROUP_WARNING.format(n=launched))
    config = {
        **recorded_config(parts, profile=profile, warmup_steps=warmup_steps),
        **(config_extra or {}),
    }
    rows = sorted((r for p in parts for r in p["rows"]), key=lambda r: (r["step"], r["rank"]))
    write_steps_csv(run_dir, rows)
    metrics = _metrics(parts, rows, wall_time_s=wall_time_s)
    for w in [*metrics.pop("warnings"), *(w for p in parts for w in p["warnings"])]:
        if w not in warnings:
            warnings.append(w)
    if not rows and NO_STEP_WARNING not in warnings:
        warnings.append(NO_STEP_WARNING)
    record: dict[str, Any] = {
        "schema_version": RUN_JSON_SCHEMA_VERSION,
        "run_id": run_id,
        "status": status,
        "error": error,
        "created_at": created_at or utc_now(),
        "finished_at": utc_now(),
        "config": config,
        "env": parts[0]["env"],
        "metrics": metrics,
        # Accuracy is the script's own business: absent (no epochs), never zeros.
        "eval": {"epochs": [], "best": None},
        "traces": sorted(t for p in parts for t in p["traces"]),
        "warnings": warnings,
    }
    write_run_json(run_dir, record)
    return record
