"""The run-folder contract (docs/reference/run-folder.md): the one place that says what a run folder holds.

Torch-free, so that both halves import it: `workloads/` and `profiler/` write run folders through
it and `analysis/` reads them with its names (typed decoding: profiler.runfolder.records). It owns

- the run-folder schema version (`RUN_JSON_SCHEMA_VERSION`; the traces JSON and the runs JSON
  of analysis/ have their own schema versions) and the versions a reader understands;
- the file names, the steps.csv and comm.csv columns, and the trace file name template;
- the nccl-tests bus model behind comm.csv's `busbw_gbps` (bus factor, ring latency steps);
- the run.json, steps.csv and comm.csv writers (atomic: profiler.runfolder.atomic) and `utc_now`, the
  timestamp format of run.json `created_at` / `finished_at`;
- the rule for the steps throughput and phases are measured on (`throughput_steps`);
- what a run id may be (`validate_run_id`, for every writer and every way an id arrives) and the
  one way a run folder is made (`create_run_folder`: exclusive, through profiler.runfolder.lease's claim).
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from profiler.runfolder.atomic import write_csv_atomic, write_json_atomic
from profiler.runfolder.errors import UserError, disk_writes
from profiler.runfolder.lease import FolderTaken, claim, owner_record

__all__ = [
    "COMM_COLUMNS",
    "COMM_CSV",
    "MAX_RUN_ID_BYTES",
    "NO_UNPROFILED_STEP_WARNING",
    "RUN_JSON",
    "RunFolderError",
    "RunFolderTaken",
    "STEPS_COLUMNS",
    "STEP_PHASES",
    "STEPS_CSV",
    "TRACE_GLOB",
    "TRACE_NAME",
    "TRACES_DIR",
    "bus_factor",
    "create_run_folder",
    "ring_steps",
    "throughput_steps",
    "trace_name",
    "utc_now",
    "validate_run_id",
    "write_comm_csv",
    "write_run_json",
    "write_steps_csv",
]

RUN_JSON, STEPS_CSV, COMM_CSV, TRACES_DIR = "run.json", "steps.csv", "comm.csv", "traces"

# The four timed phases of every optimizer step, in the order they run; steps.csv has one
# `<phase>_s` column each (STEPS_COLUMNS).
STEP_PHASES: tuple[str, ...] = ("data", "forward", "backward", "optimizer")

# Exactly the steps.csv columns of docs/reference/run-folder.md, in order (the reader's StepRow fields).
STEPS_COLUMNS: list[str] = [
    "rank",
    "epoch",
    "step",
    "warmup",
    "profiled",
    "step_time_s",
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "profiler_s",
    "samples",
    "loss",
    "rss_bytes",
    "cuda_allocated_bytes",
    "other_cpu_cores",
]

# comm.csv of a `make bench-comm` run folder: one row per collective and message size.
COMM_COLUMNS: list[str] = [
    "collective",
    "backend",
    "world_size",
    "bytes",
    "iters",
    "time_us_median",
    "time_us_p95",
    "algbw_gbps",
    "busbw_gbps",
]

# The one template of trace file names under traces/: the TensorBoard plugin reads only
# `*.pt.trace.json(.gz)` and takes the worker (`rank<r>`, `rank<r>_attempt<k>`, `dp`) from the part
# before the first '.'; the time keeps cycles apart.
TRACE_NAME = "{worker}.{time_ns}.pt.trace.json.gz"
TRACE_GLOB = TRACE_NAME.format(worker="*", time_ns="*")

NO_UNPROFILED_STEP_WARNING = (
    "no measured step outside the profiler window: samples_per_s and step_time_s include "
    "profiled steps (raise --max-steps or narrow the --profile-* schedule)"
)


MAX_RUN_ID_BYTES = 128
"""The longest run id, in bytes of its file-system encoding (far below any name limit)."""


class RunFolderError(UserError, ValueError):
    """A run id that cannot name a folder, or a run folder that is taken; one line with the fix."""


class RunFolderTaken(RunFolderError):
    """The run folder already holds a run (run.json) or is claimed by another writer."""


def validate_run_id(run_id: str, flag: str = "--run-id") -> str:
    """`run_id` if it can name exactly one folder inside the runs folder; else RunFolderError
    naming `flag`: empty, `.` or `..`, a `/` or `\\`, a control character, or more than
    MAX_RUN_ID_BYTES bytes."""
    shown = repr(run_id if len(run_id) <= 60 else run_id[:57] + "...")
    if not run_id:
        raise RunFolderError(f"{flag} is empty; give a folder name (or leave it out)")
    if run_id in (".", ".."):
        raise RunFolderError(
            f"{flag} {shown} names the runs folder or its parent, not a run folder; pick a name"
        )
    if "/" in run_id or "\\" in run_id:
        raise RunFolderError(f"{flag} is a folder name, not a path; got {shown} (use --runs-dir)")
    if any(unicodedata.category(c) == "Cc" for c in run_id):
        raise RunFolderError(f"{flag} {shown} holds a control character; use printable text")
    if (n := len(os.fsencode(run_id))) > MAX_RUN_ID_BYTES:
        raise RunFolderError(
            f"{flag} is {n} bytes long, over the {MAX_RUN_ID_BYTES}-byte limit; pick a shorter name"
        )
    return run_id


def create_run_folder(
    runs_dir: str | os.PathLike[str],
    run_id: str,
    *,
    flag: str = "--run-id",
    writer: str,
    renew_s: float | None = None,
) -> Path:
    """Make `runs_dir/run_id` and claim it for this process (`owner.json`, profiler.runfolder.lease); the
    one way every writer (launcher, `--script`, bench-comm, RunRecorder) starts a run folder.

    Exclusive: a folder that holds run.json or an owner.json is refused (RunFolderTaken), so of
    two writers started together exactly one gets it. `renew_s`: how often the writer renews its
    lease (profiler.runfolder.lease.Lease; None: it does not). The id is validated first; a disk fault is
    one DiskError line naming the path (profiler.runfolder.errors)."""
    validate_run_id(run_id, flag)
    runs = Path(runs_dir)
    run_dir = runs / run_id
    taken = RunFolderTaken(
        f"run folder {run_dir} already holds a run; pick another {flag} or remove that folder"
    )
    with disk_writes(runs):
        runs.mkdir(parents=True, exist_ok=True)
    with disk_writes(run_dir):
        run_dir.mkdir(exist_ok=True)  # a DDP peer or another node may have made it already
    if (run_dir / RUN_JSON).exists():
        raise taken
    try:
        claim(run_dir, owner_record(writer, renew_s=renew_s))
    except FolderTaken:
        raise taken from None
    return run_dir


def trace_name(worker: str, time_ns: int) -> str:
    """The file name of one trace of `worker` (TRACE_NAME)."""
    return TRACE_NAME.format(worker=worker, time_ns=time_ns)


def bus_factor(name: str, n: int) -> float | None:
    """nccl-tests busbw factor for collective `name` over `n` ranks (None: no bus model).

    comm.csv's `busbw_gbps` = `algbw_gbps` × this factor; the trace analysis and the α–β model use
    the same factors: 2(n−1)/n for all-reduce, (n−1)/n for reduce-scatter, all-gather and
    all-to-all, 1 for broadcast, reduce, send/recv, gather and scatter."""
    key = name.split(":", 1)[-1].replace("_", "").lower()
    if n < 2:  # one rank moves nothing over a bus
        return None
    if "allreduce" in key:
        return 2 * (n - 1) / n
    if any(s in key for s in ("reducescatter", "allgather", "alltoall")):
        return (n - 1) / n
    if any(s in key for s in ("broadcast", "reduce", "send", "recv", "gather", "scatter")):
        return 1.0
    return None


def ring_steps(collective: str, n: int) -> int:
    """Latency steps of the ring algorithm: 2(n−1) for all_reduce, n−1 for the others."""
    if n < 2:
        return 0
    return 2 * (n - 1) if "all_reduce" in collective else n - 1


def utc_now() -> str:
    """Now, as ISO-8601 UTC with seconds (run.json created_at / finished_at)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_run_json(run_dir: Path, record: dict) -> Path:
    """Write `record` as `run_dir/run.json` atomically (never half a record); return the path."""
    path = Path(run_dir) / RUN_JSON
    write_json_atomic(path, record)
    return path


def write_steps_csv(run_dir: Path, rows: list[dict]) -> Path:
    """Write steps.csv with exactly STEPS_COLUMNS (a row with another key raises ValueError)."""
    path = Path(run_dir) / STEPS_CSV
    write_csv_atomic(path, rows, STEPS_COLUMNS)
    return path


def write_comm_csv(run_dir: Path, rows: list[dict]) -> Path:
    """Write comm.csv with exactly COMM_COLUMNS."""
    path = Path(run_dir) / COMM_CSV
    write_csv_atomic(path, rows, COMM_COLUMNS)
    return path


def throughput_steps(
    warmup: Sequence[int] | np.ndarray, profiled: Sequence[int | None] | np.ndarray | None
) -> tuple[np.ndarray, str | None]:
    """The rule for "measured unprofiled steps": which steps.csv rows throughput, step time and
    phases are measured on, as a boolean mask over the rows, and the warning of its fallback.

    - The rows neither in warm-up (`warmup` = 0) nor traced by the profiler (`profiled` = 0),
      since traced steps carry the profiler's own cost. `profiled` None (a schema-1 steps.csv has
      no such column) counts every measured row as unprofiled; a missing cell counts as 0.
    - Fallback: when no such row exists, every measured row, and NO_UNPROFILED_STEP_WARNING.
    - No measured row at all (a run that ended within its warm-up): the empty mask, no warning.
    """
    measured = np.asarray(warmup, dtype=float) == 0
    if profiled is None:
        return measured, None
    flags = np.asarray([0 if p is None else p for p in profiled], dtype=float)
    clean = measured & ~(np.nan_to_num(flags, nan=0.0) == 1)
    if clean.any() or not measured.any():
        return clean, None
    return measured, NO_UNPROFILED_STEP_WARNING
