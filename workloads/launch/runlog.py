"""Per-rank logs and error records, and reading them back into run.json's `error` object.

Every rank tees its stdout/stderr into `logs/rank<r>.log`. A rank that raises writes
`logs/rank<r>.error.json` ({rank, exit_code, message, time}); after a failed run the launcher
picks the earliest record (the rank that failed first; the others usually only lost their peer)
and joins it with torchrun's own failure summary and the tail of that rank's log.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.runfolder.atomic import write_json_atomic
from profiler.runfolder.layout import RUN_JSON, utc_now, write_run_json
from profiler.runfolder.records import read_record
from workloads.launch.faults import read_attempts, signal_name

if TYPE_CHECKING:
    from workloads.launch.supervise import Outcome

__all__ = ["diagnose", "finalize", "rank_log", "write_error_record"]

LOG_TAIL_LINES = 20


class _Tee(io.TextIOBase):
    """Writes to the original stream and to the rank's log file."""

    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, s: str) -> int:
        for stream in self.streams:
            stream.write(s)
        return len(s)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()

    def fileno(self) -> int:
        return self.streams[0].fileno()


@contextlib.contextmanager
def rank_log(path: Path) -> Iterator[None]:
    """Tee this process's sys.stdout/sys.stderr into `path` (line-buffered, appended)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8", buffering=1) as log:
        old = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(old[0], log), _Tee(old[1], log)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = old


def write_error_record(
    run_dir: Path, *, rank: int, exc: BaseException, details: dict | None = None
) -> None:
    """Record why this rank is exiting with code 1 (read back by `diagnose`); `details` adds
    fields such as `kind`, `attempt` and `step` (workloads.launch.faults.classify)."""
    write_json_atomic(
        run_dir / "logs" / f"rank{rank}.error.json",
        {
            "rank": rank,
            "exit_code": 1,
            "message": f"{type(exc).__name__}: {exc}",
            "time": time.time(),
            **(details or {}),
        },
    )


def _tail(path: Path) -> list[str]:
    if not path.is_file():
        return []
    return path.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL_LINES:]


def _torchrun_failures(text: str) -> tuple[dict[int, int], int | None]:
    """From torchrun's failure summary: {rank: exitcode} of every failed rank, and the rank it
    names as root cause (its clock has one-second resolution, so that guess can be wrong)."""
    pairs = re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", text)
    codes = {int(r): int(c) for r, c in pairs}
    root = re.search(r"Root Cause[^\n]*\n(?:.*\n)*?\s*rank\s*:\s*(\d+)", text)
    return codes, int(root.group(1)) if root else None


def _killed_message(rank: int, code: int) -> str:
    message = f"rank {rank} was killed by {signal_name(code)} (exit code {code})"
    if code == -9:
        message += (
            "; SIGKILL is what the kernel's OOM killer sends when host memory runs out "
            "(check `dmesg`, lower --batch-size or --num-workers)"
        )
    return message


def _last_attempt(logs: Path) -> list[dict]:
    """The ranks' error records of the last attempt (earlier attempts were restarted)."""
    records = []
    for p in sorted(logs.glob("rank*.error.json")):
        try:
            records.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    if not records:
        return []
    last = max(r.get("attempt", 0) for r in records)
    return [r for r in records if r.get("attempt", 0) == last]


def _from_record(
    first: dict, codes: dict[int, int], logs: Path
) -> tuple[int, int | None, str, str, dict]:
    """(rank, exit code, kind, message, extra fields) from the first rank's error record; a
    hang names the rank whose heartbeat stopped first instead."""
    from workloads.launch.heartbeat import diagnose_hang, read_heartbeats

    rank = first["rank"]
    exit_code = codes.get(rank, first["exit_code"])
    kind = first.get("kind", "crash")
    message = f"rank {rank} failed: {first['message']}"
    extra = {k: first[k] for k in ("step", "value", "per_device_batch") if k in first}
    if kind == "hang":
        hang = diagnose_hang(read_heartbeats(logs))
        if hang.get("rank") is not None:
            message = f"{hang.pop('message')} ({message})"
            rank = hang.pop("rank")
            extra = {k: v for k, v in hang.items() if k != "kind"}
    return rank, exit_code, kind, message, extra


def _without_record(
    root: int | None, codes: dict[int, int], returncode: int, launcher_log: Path
) -> tuple[int | None, int | None, str, str]:
    """(rank, exit code, kind, message) when no rank wrote an error record: torchrun's root
    cause if it named one, else the training's own exit code."""
    if root is not None:
        exit_code = codes.get(root)
        if exit_code is not None and exit_code < 0:
            return root, exit_code, "killed", _killed_message(root, exit_code)
        message = f"rank {root} exited with code {exit_code} (see logs/rank{root}.log)"
        return root, exit_code, "crash", message
    message = (
        f"training exited with code {returncode} without writing its record "
        f"(see logs/{launcher_log.name})"
    )
    return None, returncode, "killed" if returncode < 0 else "crash", message


def diagnose(run_dir: Path, returncode: int, launcher_log: Path) -> dict:
    """The run.json `error` object for a failed run: its `kind`, the first rank that failed, its
    exit code, its message and the last lines of its log.

    Only the last attempt's error records count (earlier attempts were restarted). A rank ended
    by a signal other than torchrun's own SIGTERM, without an error record, comes first: the
    errors of its peers (a closed connection) are consequences. A rank that timed out in a
    collective means a hang: the heartbeats then name the rank that stopped first.
    """
    logs = run_dir / "logs"
    records = _last_attempt(logs)
    text = launcher_log.read_text(errors="replace") if launcher_log.is_file() else ""
    codes, root = _torchrun_failures(text)
    recorded = {r.get("rank") for r in records}
    killed = sorted(r for r, c in codes.items() if c < 0 and c != -15 and r not in recorded)
    extra: dict = {}
    if killed:
        rank = killed[0]
        exit_code, kind = codes[rank], "killed"
        message = _killed_message(rank, exit_code)
    elif records:
        first = min(records, key=lambda r: r.get("time", float("inf")))
        rank, exit_code, kind, message, extra = _from_record(first, codes, logs)
    else:
        rank, exit_code, kind, message = _without_record(root, codes, returncode, launcher_log)
    rank_log = logs / f"rank{rank}.log"
    return {
        "kind": kind,
        "message": message,
        "rank": rank,
        "exit_code": exit_code,
        **extra,
        "log_tail": _tail(rank_log if rank is not None and rank_log.is_file() else launcher_log),
    }


def finalize(run_dir: Path, outcome: Outcome, launcher_log: Path) -> dict:
    """After the training ended: turn a run.json that is not `ok` into `failed` with its error
    (and restarts); return the record. Never downgraded: once rank 0 wrote `ok`, whatever
    happens afterwards (a signal to the launcher, a rank failing in teardown) leaves it ok."""
    rec, record = read_record(run_dir / RUN_JSON)  # rank 0's `ok` record, or the launcher's own
    if rec.status != "ok":
        resumes = read_attempts(run_dir)
        record.update(
            status="failed",
            error=_error(run_dir, outcome, launcher_log),
            finished_at=utc_now(),
            restarts=max((a["attempt"] for a in resumes), default=0),
            resumes=resumes,
        )
        write_run_json(run_dir, record)
    return record


def _error(run_dir: Path, outcome: Outcome, launcher_log: Path) -> dict:
    """run.json `error` of a failed run (kinds: docs/reference/run-folder.md)."""
    if outcome.interrupted:
        return {
            "kind": "interrupted",
            "message": f"interrupted: {outcome.interrupted} reached the launcher; every rank "
            "was stopped",
            "rank": None,
            "exit_code": outcome.returncode,
            "log_tail": [],
        }
    if outcome.hang:
        base = diagnose(run_dir, outcome.returncode, launcher_log)
        return {**base, **outcome.hang, "exit_code": outcome.returncode}
    return diagnose(run_dir, outcome.returncode, launcher_log)
