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
from datetime import UTC, datetime
from pathlib import Path

from profiler.record import write_json_atomic

__all__ = ["diagnose", "rank_log", "utc_now", "write_error_record"]

LOG_TAIL_LINES = 20


def utc_now() -> str:
    """Now, as ISO-8601 UTC with seconds (run.json created_at / finished_at)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


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


def write_error_record(run_dir: Path, *, rank: int, exc: BaseException) -> None:
    """Record why this rank is exiting with code 1 (read back by `diagnose`)."""
    write_json_atomic(
        run_dir / "logs" / f"rank{rank}.error.json",
        {
            "rank": rank,
            "exit_code": 1,
            "message": f"{type(exc).__name__}: {exc}",
            "time": time.time(),
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


def diagnose(run_dir: Path, returncode: int, launcher_log: Path) -> dict:
    """The run.json `error` object for a failed run: the first rank that failed, its exit code,
    its message and the last lines of its log."""
    logs = run_dir / "logs"
    records = [json.loads(p.read_text()) for p in sorted(logs.glob("rank*.error.json"))]
    text = launcher_log.read_text(errors="replace") if launcher_log.is_file() else ""
    codes, root = _torchrun_failures(text)
    if records:
        first = min(records, key=lambda r: r.get("time", float("inf")))
        rank = first["rank"]
        exit_code = codes.get(rank, first["exit_code"])
        message = f"rank {rank} failed: {first['message']}"
    elif root is not None:
        rank, exit_code = root, codes.get(root)
        message = f"rank {rank} exited with code {exit_code} (see logs/rank{rank}.log)"
    else:
        rank, exit_code = None, returncode
        message = (
            f"training exited with code {returncode} without writing its record "
            f"(see logs/{launcher_log.name})"
        )
    rank_log = logs / f"rank{rank}.log"
    return {
        "message": message,
        "rank": rank,
        "exit_code": exit_code,
        "log_tail": _tail(rank_log if rank is not None and rank_log.is_file() else launcher_log),
    }
