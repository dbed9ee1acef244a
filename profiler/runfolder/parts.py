"""Rank parts: what each rank of a recorded run writes at its exit, and their assembly into the
standard run folder (docs/reference/run-folder.md).

A RunRecorder (profiler.recorder; the zero-code `--script` bootstrap uses one too) never needs a
collective at the end: each rank writes `logs/rank<r>.part.json` itself, also after the script
destroyed its process group, and whoever assembles (rank 0 of an in-process recorder, or the
launcher after a `--script` run) reads the parts and writes steps.csv and run.json.

Torch-free: the launcher assembles without importing what the ranks ran.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from profiler.runfolder.atomic import write_json_atomic
from profiler.runfolder.layout import (
    TRACE_GLOB,
    TRACES_DIR,
    utc_now,
    write_run_json,
    write_steps_csv,
)
from profiler.runfolder.schema import (
    PROCESS_GROUP_MODES,
    Config,
    ErrorInfo,
    Eval,
    LeftOut,
    Metrics,
    ProfileExport,
    ProfileSettings,
    RankPart,
    RunRecord,
    Status,
)
from profiler.runfolder.stepmetrics import step_metrics
from profiler.runfolder.versions import RUN_JSON_SCHEMA_VERSION

__all__ = [
    "FAILED_BEFORE_GROUP_WARNING",
    "NO_PROCESS_GROUP_WARNING",
    "NO_STEP_WARNING",
    "assemble",
    "first_signal",
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


FAILED_BEFORE_GROUP_WARNING = (
    "the script failed before init_process_group: rank {rank} ended with exit code {code} and no "
    "rank had joined a process group, so nothing was measured as DDP (see `error`)"
)
LEFT_OUT_REASON = (
    "rank {rank} never joined a process group: its process trained alone, and the run is "
    "recorded from rank 0's process only"
)
NO_PART_WARNING = (
    "rank {rank} wrote no part (killed before it could?): its traces on disk are listed, its "
    "steps are missing"
)


def part_path(run_dir: Path, rank: int) -> Path:
    """`logs/rank<r>.part.json`: one rank's part."""
    return Path(run_dir) / "logs" / f"rank{rank}.part.json"


def write_part(run_dir: Path, part: RankPart) -> Path:
    """Write one rank's part atomically; return its path. The one part writer: it takes a
    RankPart only."""
    if not isinstance(part, RankPart):
        raise TypeError(f"write_part takes a RankPart, not {type(part).__name__}")
    path = part_path(run_dir, part.rank)
    write_json_atomic(path, msgspec.to_builtins(part))
    return path


def read_parts(run_dir: Path) -> list[RankPart]:
    """Every rank part in the run folder, by rank (an unreadable one is left out: its rank
    failed while writing and the run's error says so)."""
    parts = []
    for path in sorted((Path(run_dir) / "logs").glob("rank*.part.json")):
        try:
            parts.append(msgspec.json.decode(path.read_bytes(), type=RankPart))
        except (OSError, msgspec.DecodeError):
            continue
    return sorted(parts, key=lambda p: p.rank)


def wait_for_parts(run_dir: Path, world_size: int, *, timeout_s: float) -> list[RankPart]:
    """The parts of all `world_size` ranks, or those there after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while len(parts := read_parts(run_dir)) < world_size and time.monotonic() < deadline:
        time.sleep(0.2)
    return parts


def _most_common(values: list[int]) -> int | None:
    return Counter(values).most_common(1)[0][0] if values else None


def recorded_config(
    parts: list[RankPart], *, profile: ProfileSettings, warmup_steps: int
) -> Config:
    """The run record's `config` of a recorded run: the mode, world and devices the ranks saw,
    the model they trained, and the samples per step (the most common per rank and summed over
    ranks)."""
    first = parts[0]
    # Hosts are known only when every launched rank wrote a part naming its own: a node whose
    # ranks all died, or a part without a host, would be miscounted, and the one-node host rule
    # (analysis.runs.fields) trusts `nnodes`. Unknown: null, and the ranks counted as one host.
    hosts = Counter(p.env.hostname for p in parts)
    known = None not in hosts and "" not in hosts and len(parts) >= first.env_world_size
    per_host = max(hosts.values()) if known else len(parts)
    per_step: dict[int, int] = {}
    for r in (r for p in parts for r in p.rows):
        per_step[r.step] = per_step.get(r.step, 0) + (r.samples or 0)
    return Config.written(
        mode=first.mode,
        backend=first.backend,
        world_size=first.world_size,
        nnodes=len(hosts) if known else None,
        nproc_per_node=per_host if first.mode in PROCESS_GROUP_MODES else 1,
        devices=[d for p in parts for d in p.devices],
        model=first.model,
        param_count=first.param_count,
        dataset=None,
        global_batch=_most_common(list(per_step.values())) or None,
        per_device_batch=_most_common([r.samples for r in first.rows if r.samples]),
        grad_accum_steps=_most_common(first.micro_batches) or 1,
        scaling=None,
        amp=None,
        seed=None,
        warmup_steps=warmup_steps,
        profile=profile,
        workload=first.workload,
        zero=first.zero,
        fsdp=first.fsdp_config,
    )


def _profile(parts: list[RankPart]) -> list[ProfileExport]:
    """The run record's `metrics.profile`: per rank, the seconds its profiler spent exporting
    traces (`export_s`; profiler.callbacks.ProfilerStep), in its steps (in their `profiler_s`)
    or after its last one."""
    return [
        ProfileExport(rank=p.rank, export_s=sum(e.export_s for e in p.profile_exports))
        for p in parts
        if isinstance(p.profile_exports, list)  # a `--script` rank's (None or absent otherwise)
    ]


def _metrics(
    parts: list[RankPart], rows: list, *, wall_time_s: float | None
) -> tuple[Metrics, list[str]]:
    active = {(p.rank, s) for p in parts for s in p.active_steps}
    metrics, warnings = step_metrics(rows, active)
    first = parts[0]
    metrics = msgspec.structs.replace(
        metrics,
        epoch_time_s=[],
        # rank 0's time from its recorder's creation (the bootstrap: the script's start) to its end
        wall_time_s=first.wall_time_s if wall_time_s is None else wall_time_s,
        memory=[m for p in parts for m in p.memory],
        memory_after_first_step=[m for p in parts for m in p.memory_after_first_step],
        memory_breakdown=[m for p in parts for m in p.memory_breakdown],
        ddp=first.ddp,
        fsdp=first.fsdp,
        param_grad_bytes=first.param_grad_bytes,
        buffer_bytes_by_dtype=first.buffer_bytes_by_dtype,
        profile=_profile(parts),
    )
    return metrics, warnings


def first_signal(parts: list[RankPart]) -> RankPart | None:
    """The part of the rank a signal reached first (`ended` = `signal`), or None."""
    signalled = [p for p in parts if p.ended == "signal"]
    return min(signalled, key=lambda p: p.signal_time or 0.0, default=None)


def _no_group(parts: list[RankPart], warnings: list[str]) -> tuple[list[RankPart], list[LeftOut]]:
    """Under a multi-process launch in which no process joined a process group: (the parts the
    record keeps, the traces it leaves out). A script that failed there (some rank ended
    `failed`) keeps every part and says so; one whose processes all trained alone keeps rank
    0's, and the others' traces are left out with the reason."""
    launched = max(len(parts), parts[0].env_world_size)
    if launched <= 1 or any(p.pg_seen for p in parts):
        return parts, []
    failed = [p for p in parts if p.ended == "failed"]
    if failed:
        warnings.append(
            FAILED_BEFORE_GROUP_WARNING.format(rank=failed[0].rank, code=failed[0].exit_code)
        )
        return parts, []
    kept = [p for p in parts if p.rank == 0] or parts[:1]
    warnings.append(NO_PROCESS_GROUP_WARNING.format(n=launched))
    left = [
        LeftOut(file=t, reason=LEFT_OUT_REASON.format(rank=p.rank))
        for p in parts
        if p not in kept
        for t in p.traces
    ]
    return kept, left


def _unclaimed(
    run_dir: Path, parts: list[RankPart], left: list[LeftOut], warnings: list[str]
) -> list[str]:
    """Traces on disk of ranks that wrote no part (killed): listed, with a warning per rank."""
    claimed = {t for p in parts for t in p.traces} | {t.file for t in left}
    ranks = {p.rank for p in parts}
    found = []
    for path in sorted((Path(run_dir) / TRACES_DIR).glob(TRACE_GLOB)):
        name = f"{TRACES_DIR}/{path.name}"
        rank = path.name.split(".", 1)[0].removeprefix("rank").split("_", 1)[0]
        if name in claimed or not rank.isdigit() or int(rank) in ranks:
            continue
        found.append(name)
        if (w := NO_PART_WARNING.format(rank=rank)) not in warnings:
            warnings.append(w)
    return found


def _layout(parts: list[RankPart], config: Config, failed_before_group: bool) -> Config:
    """A script that failed before any rank joined a group keeps the launched layout: DDP over
    its processes (what was asked for; nothing ran as anything else)."""
    if not failed_before_group:
        return config
    n = max(len(parts), parts[0].env_world_size)
    return msgspec.structs.replace(config, mode="ddp", world_size=n, nproc_per_node=n)


def assemble(
    run_dir: Path,
    parts: list[RankPart],
    *,
    run_id: str,
    status: Status,
    profile: ProfileSettings,
    warmup_steps: int,
    config_extra: dict[str, Any] | None = None,
    created_at: str | None = None,
    error: ErrorInfo | None = None,
    wall_time_s: float | None = None,
) -> RunRecord:
    """Write steps.csv and run.json from the ranks' `parts`; return the run record. `config` is
    `recorded_config` with the Config fields of `config_extra` (a script run's path, arguments
    and hash).

    Under a multi-process launch in which no process joined a process group, see `_no_group`;
    `traces` lists every rank's traces, also those on disk of a rank that wrote no part, and
    `traces_left_out` those of the processes left out, each with its reason."""
    warnings: list[str] = []
    parts, left = _no_group(parts, warnings)
    config = msgspec.structs.replace(
        recorded_config(parts, profile=profile, warmup_steps=warmup_steps), **(config_extra or {})
    )
    config = _layout(parts, config, any(w.startswith("the script failed before") for w in warnings))
    rows = sorted((r for p in parts for r in p.rows), key=lambda r: (r.step, r.rank))
    write_steps_csv(run_dir, rows)
    metrics, metric_warnings = _metrics(parts, rows, wall_time_s=wall_time_s)
    for w in [*metric_warnings, *(w for p in parts for w in p.warnings)]:
        if w not in warnings:
            warnings.append(w)
    if not rows and NO_STEP_WARNING not in warnings:
        warnings.append(NO_STEP_WARNING)
    traces = [t for p in parts for t in p.traces] + _unclaimed(run_dir, parts, left, warnings)
    reason = next((p.stop_reason for p in parts if p.stop_reason), None)
    record = RunRecord.written(
        schema_version=RUN_JSON_SCHEMA_VERSION,
        run_id=run_id,
        status=status,
        error=error,
        created_at=created_at or utc_now(),
        finished_at=utc_now(),
        config=config,
        env=parts[0].env,
        metrics=metrics,
        # Accuracy is the script's own business: absent (no epochs), never zeros.
        eval=Eval.written(epochs=[], best=None),
        traces=sorted(traces),
        traces_left_out=left,
        warnings=warnings,
        **({"stop_reason": reason} if reason else {}),
    )
    write_run_json(run_dir, record)
    return record
