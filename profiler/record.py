"""The run record: atomic writers for run.json / steps.csv and the `env` block of run.json.

Field names follow docs/run-folder.md exactly; that document is the contract with `analysis/`.
Writes go to a temp file in the same folder, are fsync'ed, then `os.replace`d over the target,
so a reader (or a crash) never sees a half-written record.
"""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "SCHEMA_VERSION",
    "STEPS_COLUMNS",
    "collect_env",
    "write_csv_atomic",
    "write_json_atomic",
]

SCHEMA_VERSION: int = 2

# Exactly the steps.csv columns of docs/run-folder.md, in order.
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
    "samples",
    "loss",
    "rss_bytes",
    "cuda_allocated_bytes",
]


# The process umask, read once at import (reading it means setting it, so not from threads).
_UMASK = os.umask(0)
os.umask(_UMASK)


def _write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same folder as the target: os.replace is only atomic within one filesystem.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates the file 0600; give the record the mode open() would (umask applied),
        # so a run folder on a shared filesystem is as readable as its traces and logs.
        os.chmod(tmp, 0o666 & ~_UMASK)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write `obj` as indented JSON to `path` atomically (temp file + fsync + os.replace)."""
    _write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def write_csv_atomic(path: Path, rows: list[dict], columns: list[str]) -> None:
    """Write `rows` as CSV with exactly `columns` (in order) atomically; None becomes an empty cell.

    A row with a key outside `columns` is a bug in the caller, so it raises ValueError.
    """
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    _write_text_atomic(path, buf.getvalue())


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def _nccl_version() -> str | None:
    if not (torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        return None
    try:
        version = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError):  # CPU-only builds have no NCCL library to ask
        return None
    return ".".join(str(p) for p in version) if isinstance(version, tuple) else str(version)


def collect_env(*, threads_per_rank: int) -> dict:
    """The run.json `env` object (docs/run-folder.md): software versions and the machine."""
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    return {
        "os": platform.system(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        # torch.version.cuda is the build's CUDA; report it only where a GPU can use it.
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "nccl": _nccl_version(),
        "gpus": gpus,
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "threads_per_rank": int(threads_per_rank),
        "hostname": socket.gethostname(),
    }
