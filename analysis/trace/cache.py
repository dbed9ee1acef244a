"""The trace cache (opt-in): a rank's summary kept as Parquet next to its trace, so a second
analysis of the same trace (another report, another `dpscope runs`) skips decoding it.

dpscope writes nothing beside a user's traces unless asked: the cache is on only with
`dpscope traces --cache`, `DPSCOPE_TRACE_CACHE=1` or `analyze_traces(..., cache=True)`. Then
`<trace folder>/.dpscope-cache/<trace file name>.parquet` holds one row (summaryrows.py) keyed by
the trace's path as given, size and modification time (ns) and a fingerprint of the analysis code,
so an edited trace, or another dpscope version, is analysed afresh and the entry rewritten.

Safe on any folder: a read-only or full folder only means no cache (the analysis is the same); the
entry is written atomically (temp file, then rename), so a reader never sees half of one; the
cache folder must be a real folder and the entry a regular file (a link there is ignored, never
followed for writing); an unreadable or foreign entry is ignored and replaced. `rm -r .dpscope-cache`
removes it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from analysis.trace.rank import RankSummary, summarize_file
from analysis.trace.summaryrows import read_rows, summary_from_json, summary_table
from profiler.runfolder.errors import InputError
from profiler.runfolder.versions import TRACES_PART_SCHEMA_VERSION

__all__ = ["CACHE_DIR", "CACHE_ENV", "cache_enabled", "summarize_cached"]

CACHE_DIR = ".dpscope-cache"
CACHE_ENV = "DPSCOPE_TRACE_CACHE"
_CACHE_VERSION = 2  # 2: calls carry their algorithm, phase and exposed time


def cache_enabled(flag: bool | None = None) -> bool:
    """`flag` when given, else whether DPSCOPE_TRACE_CACHE is set to 1/true/yes/on."""
    if flag is not None:
        return flag
    return os.environ.get(CACHE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@functools.cache
def code_fingerprint() -> str:
    """sha256 over the trace analysis' source (and the bus factors it reads): a cache entry
    written by other code is never taken."""
    import profiler.runfolder.layout as layout  # bus_factor: the collectives' bus model

    files = sorted(Path(__file__).parent.glob("*.py")) + [Path(layout.__file__)]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()


def _key(path: Path) -> dict | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {
        "version": _CACHE_VERSION,
        "file": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "code": code_fingerprint(),
    }


def _entry(path: Path) -> Path:
    return path.parent / CACHE_DIR / f"{path.name}.parquet"


def _is(path: Path, kind: int) -> bool:
    try:
        return stat.S_IFMT(os.lstat(path).st_mode) == kind
    except OSError:
        return False


def _load(path: Path, key: dict) -> RankSummary | None:

    entry = _entry(path)
    if not (_is(entry.parent, stat.S_IFDIR) and _is(entry, stat.S_IFREG)):
        return None
    try:
        header, rows = read_rows(entry, TRACES_PART_SCHEMA_VERSION)
        if header != key or len(rows) != 1:
            return None
        return summary_from_json(rows[0], entry)
    except (InputError, ValueError, TypeError, KeyError):
        return None


def _store(path: Path, key: dict, summary: RankSummary) -> None:
    """Write the entry; any failure (read-only folder, full disk, a link in the way) is no cache."""

    entry = _entry(path)
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
    try:
        if not _is(entry.parent, stat.S_IFDIR):
            entry.parent.mkdir(exist_ok=False)
        if os.path.lexists(entry) and not _is(entry, stat.S_IFREG):
            return
        pq.write_table(summary_table([summary], key, TRACES_PART_SCHEMA_VERSION), tmp)
        os.replace(tmp, entry)
    except (OSError, pa.ArrowException, TypeError, ValueError, json.JSONDecodeError):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def summarize_cached(path: Path, *, cache: bool) -> RankSummary:
    """`summarize_file(path)`, from and into the cache when `cache`."""
    key = _key(Path(path)) if cache else None
    if key is None:
        return summarize_file(path)
    hit = _load(Path(path), key)
    if hit is not None:
        return hit
    summary = summarize_file(path)
    _store(Path(path), key, summary)
    return summary
