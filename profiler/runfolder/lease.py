"""Who writes a run folder: `owner.json`, the claim that makes a run folder exclusive, and the
lease that tells a later reader whether that writer is still alive.

`claim` creates `owner.json` atomically and exclusively (written to a temp file, then
`os.link`ed to its name, which fails when the name exists), so of two writers that start at once
exactly one owns the folder. The record names the writer (`launcher`, `recorder`, `bench-comm`),
its pid, host and the pid's start time (a reused pid is another process), and `renewed_at`.

The launcher renews the lease (`Lease`, every `renew_s` seconds) while its training runs. A run
whose run.json still says `running` is read as killed (`owner_gone`) when its owner is a process
of this host that no longer exists, or, seen from another host, when a renewing owner has not
renewed for STALE_RENEWALS periods. Torch-free (psutil only), so analysis/ reads it too.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from pathlib import Path

import psutil

from profiler.runfolder.atomic import write_json_atomic
from profiler.runfolder.errors import disk_writes

__all__ = [
    "OWNER_JSON",
    "RENEW_S",
    "STALE_RENEWALS",
    "Lease",
    "claim",
    "killed_error",
    "owner_gone",
    "owner_record",
    "read_owner",
]

OWNER_JSON = "owner.json"
RENEW_S = 10.0
"""How often the launcher renews its lease (owner.json `renewed_at`)."""
STALE_RENEWALS = 6
"""A renewing owner seen from another host is gone after this many missed renewals."""


def _started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def owner_record(writer: str, *, renew_s: float | None = None) -> dict:
    """owner.json of this process as `writer` (renew_s: how often it renews; None: never)."""
    return {
        "writer": writer,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "pid_started": _started(os.getpid()),
        "renew_s": renew_s,
        "renewed_at": time.time(),
    }


class FolderTaken(Exception):
    """`claim` found an owner.json already there."""


def claim(run_dir: Path, record: dict) -> Path:
    """Create `run_dir/owner.json` holding `record`, exclusively: FolderTaken when it exists.
    A reader never sees it half-written (link of a complete temp file)."""
    path = Path(run_dir) / OWNER_JSON
    tmp = path.with_name(f".{OWNER_JSON}.{secrets.token_hex(6)}.tmp")
    with disk_writes(path):
        try:
            tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise FolderTaken(path) from None
            except OSError:  # a file system without hard links: O_EXCL, then the content
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
        except FileExistsError:
            raise FolderTaken(path) from None
        finally:
            tmp.unlink(missing_ok=True)
    return path


def read_owner(run_dir: Path) -> dict | None:
    """owner.json of `run_dir`, or None when absent or unreadable (a folder from before it)."""
    try:
        data = json.loads((Path(run_dir) / OWNER_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def owner_gone(run_dir: Path, *, now: float | None = None) -> str | None:
    """Why the writer of `run_dir` is known to be gone (one phrase), or None when it may still be
    running (or nothing says who it was)."""
    owner = read_owner(run_dir)
    if owner is None or not isinstance(owner.get("pid"), int):
        return None
    pid, writer = owner["pid"], str(owner.get("writer", "writer"))[:40]
    if owner.get("host") == socket.gethostname():
        started = _started(pid)
        recorded = owner.get("pid_started")
        if started is None or (isinstance(recorded, int | float) and abs(started - recorded) > 1):
            return f"its {writer} (pid {pid}) is no longer running"
        return None
    renew_s, renewed = owner.get("renew_s"), owner.get("renewed_at")
    if isinstance(renew_s, int | float) and isinstance(renewed, int | float) and renew_s > 0:
        silent = (time.time() if now is None else now) - renewed
        if silent > STALE_RENEWALS * renew_s:
            host = str(owner.get("host"))[:80]
            return f"its {writer} on {host} stopped renewing its lease {silent:.0f} s ago"
    return None


def killed_error(run_dir: Path) -> dict | None:
    """The run.json `error` a reader gives a run that still says `running` when its launcher is
    gone (owner_gone): kind `launcher_killed`; None when it may still be running."""
    why = owner_gone(run_dir)
    if why is None:
        return None
    return {
        "kind": "launcher_killed",
        "message": f"run.json still says running, but {why} (see logs/)",
        "rank": None,
        "exit_code": None,
        "log_tail": [],
    }


class Lease:
    """Renews owner.json's `renewed_at` every `renew_s` seconds from a daemon thread until
    `stop()`; a renewal the disk refuses is skipped (the pid check still works on this host)."""

    def __init__(self, run_dir: Path, writer: str, *, renew_s: float = RENEW_S) -> None:
        self.path = Path(run_dir) / OWNER_JSON
        self.record = owner_record(writer, renew_s=renew_s)
        self.renew_s = renew_s
        self._stop = threading.Event()
        self._renew()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="lease")
        self._thread.start()

    def _renew(self) -> None:
        try:
            write_json_atomic(self.path, dict(self.record, renewed_at=time.time()))
        except Exception:  # noqa: BLE001 - a full disk must not stop the run it leases
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self.renew_s):
            self._renew()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
