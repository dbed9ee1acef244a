"""Per-rank logs and error records, and reading them back into run.json's `error` object.

Every rank tees its stdout/stderr into `logs/rank<r>.log`. A rank that raises writes
`logs/rank<r>.error.json` ({rank, exit_code, message, time}); after a failed run the launcher
picks the earliest record (the rank that failed first; the others usually only lost their peer)
and joins it with torchrun's own failure summary and the tail of that rank's log.

Bounded by design: a log tail is read from the file's last TAIL_READ_BYTES only, keeps at most
LOG_TAIL_LINES lines of at most LOG_LINE_CHARS characters each (a 70 MB line is cut, saying how
much), and messages are cut at MESSAGE_CHARS, so run.json stays small whatever a script printed.
A run that fails on a full disk (or any disk fault, with no error record to say otherwise) gets
`error.kind: "disk"`.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.runfolder.atomic import write_json_atomic
from profiler.runfolder.errors import DiskError
from profiler.runfolder.layout import RUN_JSON, utc_now, write_run_json
from profiler.runfolder.records import read_record
from workloads.launch.faults import read_attempts, signal_name
from workloads.launch.frexplain import explain_failure

if TYPE_CHECKING:
    from workloads.launch.supervise import Outcome

__all__ = ["cut", "diagnose", "finalize", "leftover_warning", "rank_log", "write_error_record"]

LOG_TAIL_LINES = 20
LOG_LINE_CHARS = 500
"""A tail line longer than this keeps its start and says how many characters were cut."""
TAIL_READ_BYTES = 64 << 10
"""Bytes read from a log's end for its tail (and of torchrun's summary, the last MiB)."""
MESSAGE_CHARS = 2000
"""An error message (a rank's exception text) is cut here in run.json."""
_SUMMARY_READ_BYTES = 1 << 20
DISK_FREE_BYTES = 1 << 20
"""A failed run whose disk has less than this free is a disk failure (error.kind `disk`)."""


class _Tee(io.TextIOBase):
    """Writes to the original stream and to the rank's log file."""

    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, s: str) -> int:
        self.streams[0].write(s)
        for stream in self.streams[1:]:
            try:
                stream.write(s)
            except (OSError, ValueError):  # a full disk: the console keeps the output
                self.streams = tuple(x for x in self.streams if x is not stream)
        return len(s)

    def flush(self) -> None:
        for stream in self.streams:
            with contextlib.suppress(OSError, ValueError):
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
            "message": cut(f"{type(exc).__name__}: {exc}", MESSAGE_CHARS),
            "time": time.time(),
            **(details or {}),
        },
    )


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how many more there were."""
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit:,} more chars]"


def _read_end(path: Path, nbytes: int) -> tuple[str, bool]:
    """The last `nbytes` of `path` as text, and whether the file is longer (the first line of
    the text is then partial)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - nbytes))
            return f.read(nbytes).decode("utf-8", errors="replace"), size > nbytes
    except OSError:
        return "", False


def _tail(path: Path) -> list[str]:
    """The last LOG_TAIL_LINES lines of `path`, each cut at LOG_LINE_CHARS (module docstring)."""
    if not path.is_file():
        return []
    text, partial = _read_end(path, TAIL_READ_BYTES)
    lines = text.splitlines()
    if partial and lines:
        lines[0] = "… " + lines[0]  # the end of a line that began before what was read
    return [cut(line, LOG_LINE_CHARS) for line in lines[-LOG_TAIL_LINES:]]


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
    message = f"rank {rank} failed: {cut(str(first['message']), MESSAGE_CHARS)}"
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
    text = _read_end(launcher_log, _SUMMARY_READ_BYTES)[0]  # torchrun's summary is at its end
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


def leftover_warning(leftovers: tuple[str, ...]) -> str:
    """run.json `warnings` line for processes the job left running (workloads.launch.supervise)."""
    return (
        f"the job left {len(leftovers)} process(es) running after it exited, ended by the "
        f"launcher: {'; '.join(leftovers)}"
    )


def finalize(run_dir: Path, outcome: Outcome, launcher_log: Path) -> dict:
    """After the training ended: turn a run.json that is not `ok` into `failed` with its error
    (explained from the flight-recorder dumps: workloads.launch.frexplain) and restarts;
    return the record. Never downgraded: once rank 0 wrote `ok`, whatever happens afterwards
    (a signal to the launcher, a rank failing in teardown) leaves it ok. Processes the job left
    behind add a warning either way."""
    rec, record = read_record(run_dir / RUN_JSON)  # rank 0's `ok` record, or the launcher's own
    changed = bool(outcome.leftovers)
    if outcome.leftovers:
        record["warnings"] = [*record.get("warnings", []), leftover_warning(outcome.leftovers)]
    if rec.status != "ok":
        resumes = read_attempts(run_dir)
        record.update(
            status="failed",
            error=explain_failure(
                run_dir, _error(run_dir, outcome, launcher_log), record, tail=_tail
            ),
            finished_at=utc_now(),
            restarts=max((a["attempt"] for a in resumes), default=0),
            resumes=resumes,
        )
        changed = True
    if changed:
        _write_final(run_dir, record)
    return record


def _write_final(run_dir: Path, record: dict) -> None:
    """run.json, atomically; on a full disk (no room for the temp file) the record is written
    over the old one in place, without its log tail: a `failed` record that is not atomic beats
    a `running` one forever."""
    try:
        write_run_json(run_dir, record)
    except DiskError as err:
        if err.errno != errno.ENOSPC:
            raise
        error = record.get("error")
        small = dict(record, error=dict(error, log_tail=[])) if isinstance(error, dict) else record
        data = (json.dumps(small, indent=2, allow_nan=False) + "\n").encode()
        try:
            with open(run_dir / RUN_JSON, "r+b") as f:
                f.write(data)
                f.truncate()
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            raise err from None


def _disk_full(run_dir: Path) -> int | None:
    """Bytes free on the disk of `run_dir` when under DISK_FREE_BYTES, else None."""
    try:
        free = shutil.disk_usage(run_dir).free
    except OSError:
        return None
    return free if free < DISK_FREE_BYTES else None


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
    error = diagnose(run_dir, outcome.returncode, launcher_log)
    free = _disk_full(run_dir) if error["kind"] == "crash" else None
    if free is not None:  # a rank that could not even write its error record
        error.update(
            kind="disk",
            message=f"{run_dir}: the disk is full ({free:,} bytes free) — free space there or "
            f"point --runs-dir at another disk ({error['message']})",
        )
    return error
