"""The `env` block of run.json: software versions and the machine (needs torch to ask).

Everything else a run folder holds (schema version, columns, writers) is profiler.runfolder.layout's.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path

import torch

__all__ = ["collect_env", "device_memory_bytes"]


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


def device_memory_bytes(device_type: str | None = None) -> int | None:
    """Total memory of one compute device, bytes: the first GPU's (torch's total_memory) for
    `cuda`, the host's RAM (psutil) for `cpu`; `None` (the default) asks for CUDA when torch
    sees a GPU. run.json `env.device_memory_bytes`: the per-rank memory budget's default."""
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.get_device_properties(0).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


def collect_env(*, threads_per_rank: int | None, device_type: str | None = None) -> dict:
    """The run.json `env` object (docs/reference/run-folder.md): software versions and the machine
    (`threads_per_rank` None for a skipped run, which has no layout; `device_type` the run's
    devices, cpu | cuda, for `device_memory_bytes`)."""
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
        "threads_per_rank": None if threads_per_rank is None else int(threads_per_rank),
        "device_memory_bytes": device_memory_bytes(device_type),
        "hostname": socket.gethostname(),
    }
