"""Atomic file writes: the one writer behind run.json, steps.csv, checkpoints and report files.

Torch-free on purpose: `analysis/` (which never imports torch) writes its JSON and report files
through it too. A write goes to a temp file in the target's folder (os.replace is atomic only
within one filesystem), is fsync'ed, then replaces the target, so a reader or a crash never sees
half a file; on any failure the temp file is removed and the old target is left as it was. A
write the disk refuses (full, read-only, no permission, ...) is one DiskError line naming the
target (profiler.runfolder.errors.disk_writes).

The temp file is created with mode 0666 and the kernel applies the process umask, so the result
has the mode a plain `open(path, "w")` would give it (mkstemp's private 0600 would make records
and reports unreadable to other users of a shared machine).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from profiler.runfolder.errors import disk_writes

__all__ = [
    "atomic_path",
    "write_csv_atomic",
    "write_json_atomic",
    "write_text_atomic",
]


@contextlib.contextmanager
def atomic_path(path: Path, *, fsync: bool = True) -> Iterator[Path]:
    """Yield a fresh temp path next to `path`; when the block ends without error, fsync it and
    move it over `path`. Use it for writers that want a file name (e.g. `torch.save`).

    `fsync=False` keeps the all-or-nothing replace but not durability across a power cut: for
    files rewritten every fraction of a second whose loss costs nothing (heartbeats)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    with disk_writes(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL: never reuse someone else's file; 0o666 & ~umask is what open() would give.
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        with disk_writes(path):
            yield tmp
            if fsync:
                fd = os.open(tmp, os.O_RDWR)  # read-write: Windows cannot flush a read-only handle
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str, *, fsync: bool = True) -> None:
    """Write `text` (UTF-8, newlines as given) to `path` atomically (see atomic_path's fsync)."""
    with atomic_path(path, fsync=fsync) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write `obj` as indented JSON to `path` atomically; NaN/inf raise ValueError (not JSON)."""
    write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def write_csv_atomic(path: Path, rows: list[dict], columns: list[str]) -> None:
    """Write `rows` as CSV with exactly `columns` (in order) atomically; None becomes an empty cell.

    A row with a key outside `columns` is a bug in the caller, so it raises ValueError.
    """
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    write_text_atomic(path, buf.getvalue())
