"""Sharded trace analysis for jobs too large for one process: reduce shards anywhere (a Slurm job
array, any batch system), then merge.

`python -m analysis traces DIR --shard K/N --json part-K.json` reduces only shard K's files: the
folder's trace files sorted by path, file i going to shard i mod N. A part holds each of its
ranks' full summary, including the per-rank collective call arrays (start, end, latency, device
time, bytes, group size) that clock alignment, cross-rank matching, stragglers and the step-time
spread need, not only
totals. `python -m analysis merge part-*.json --json all.json` checks that the parts belong
together and runs the same cross-rank step as the unsharded analysis, so its output is exactly the
unsharded traces JSON (JSON floats round-trip exactly).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from analysis.trace.executors import Executor
from analysis.trace.folder import combine_summaries, find_trace_files, reduce_files
from analysis.trace.rank import RankSummary
from analysis.trace.summaryrows import read_rows, summary_from_json, summary_table
from profiler.runfolder.errors import InputError
from profiler.runfolder.inputfile import BadJSON, decode_json
from profiler.runfolder.versions import TRACES_PART_SCHEMA_VERSION

__all__ = [
    "PART_KIND",
    "analyze_shard",
    "merge_parts",
    "parse_shard",
    "part_json",
    "reduce_shard",
    "write_parquet_part",
]

PART_KIND = "dpscope traces part"


def parse_shard(text: str) -> tuple[int, int]:
    """`K/N` -> (K, N) with N >= 1 and 0 <= K < N; anything else is one InputError line."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
        raise InputError(
            "--shard",
            f"{text!r} is not K/N with N >= 1 and 0 <= K < N",
            "e.g. --shard 0/16 for the first of 16 shards (--shard $SLURM_ARRAY_TASK_ID/16)",
        )
    return int(m.group(1)), int(m.group(2))


def _to_json(summary: RankSummary) -> dict:
    """A rank summary as part JSON: every field, the instance arrays as lists."""
    out = {k: getattr(summary, k) for k in summary.__struct_fields__}
    if summary.clock_probe is not None:  # a Struct: as its JSON fields
        out["clock_probe"] = msgspec.structs.asdict(summary.clock_probe)
    out["instances"] = {
        name: {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in inst.items()}
        for name, inst in summary.instances.items()
    }
    return out


def analyze_shard(
    path: Path, shard: str, *, workers: int | None = None, progress: bool = True
) -> dict:
    """The part JSON of shard `K/N` of the trace folder `path` (see the module docstring)."""
    return part_json(*reduce_shard(path, shard, workers=workers, progress=progress))


def reduce_shard(
    path: Path,
    shard: str,
    *,
    workers: int | None = None,
    progress: bool = True,
    executor: Executor | None = None,
) -> tuple[dict, list[RankSummary]]:
    """Shard `K/N` of the trace folder `path`: (the part's header, its rank summaries)."""
    k, n = parse_shard(shard)
    files = find_trace_files(path)
    mine = files[k::n]
    good, skipped = (
        reduce_files(mine, workers=workers, progress=progress, executor=executor)
        if mine
        else ([], [])
    )
    header = {
        "kind": PART_KIND,
        "schema_version": TRACES_PART_SCHEMA_VERSION,
        "trace_dir": str(path),
        "shard": k,
        "shards": n,
        "files": [str(f) for f in files],
        "shard_files": [str(f) for f in mine],
        "skipped": skipped,
    }
    return header, sorted(good, key=lambda s: s.file)


def part_json(header: dict, summaries: list[RankSummary]) -> dict:
    """The part JSON (docs/reference/schemas.md) of a shard."""
    body = {k: v for k, v in header.items() if k != "skipped"}
    return {**body, "summaries": [_to_json(s) for s in summaries], "skipped": header["skipped"]}


def write_parquet_part(header: dict, summaries: list[RankSummary], out: Path) -> None:
    """The part as Parquet (summaryrows.py), written atomically."""
    import pyarrow.parquet as pq

    from profiler.runfolder.atomic import atomic_path

    table = summary_table(summaries, header, TRACES_PART_SCHEMA_VERSION)
    with atomic_path(out) as tmp:
        pq.write_table(table, tmp)


MAX_SHARDS = 1_000_000  # a part's `shards` (N): beyond any job array, far below a memory bomb


class _Part(msgspec.Struct):
    """A part JSON's fields merge decides on, typed (the rest passes)."""

    kind: Literal["dpscope traces part"]
    schema_version: int
    trace_dir: str
    shard: Annotated[int, msgspec.Meta(ge=0)]
    shards: Annotated[int, msgspec.Meta(ge=1, le=MAX_SHARDS)]
    files: list[str]
    summaries: list[dict[str, Any]]
    skipped: list[dict[str, Any]]


def _is_parquet(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PAR1"
    except OSError:
        return False


def _read_json_part(path: Path, fix: str) -> Any:
    try:
        part = decode_json(path, "part", "re-run that shard", unique=False)
    except BadJSON as err:
        raise InputError(path, f"unreadable ({err.what})", err.fix) from None
    except InputError as err:
        if err.what == "missing":
            raise InputError(path, "does not exist", "pass the files `--shard` wrote") from None
        raise
    if not isinstance(part, dict) or part.get("kind") != PART_KIND:
        raise InputError(path, "is not a traces part", fix)
    return part


def _read_part(path: Path) -> dict[str, Any]:
    """A part JSON through the reading rules of every record (profiler.runfolder.inputfile: a regular file
    under the size limit, bounded nesting), its fields typed; one InputError line otherwise."""
    fix = "pass the part-K.json files written by `python -m analysis traces DIR --shard K/N`"
    if _is_parquet(path):
        header, rows = read_rows(path, TRACES_PART_SCHEMA_VERSION)
        part = {**header, "summaries": rows}
        if not isinstance(header, dict) or header.get("kind") != PART_KIND:
            raise InputError(path, "is not a traces part", fix)
    else:
        part = _read_json_part(path, fix)
    try:
        typed = msgspec.convert(part, _Part)
    except msgspec.ValidationError as err:
        raise InputError(path, f"is a broken traces part ({err})", "re-run that shard") from None
    if typed.shard >= typed.shards:
        raise InputError(
            path, f"is shard {typed.shard} of only {typed.shards}", "re-run that shard"
        )
    return part


def _names(paths: list[Path]) -> str:
    return ", ".join(str(p) for p in paths)


def _same(parts: list[tuple[Path, dict]], key: str, what: str, fix: str) -> None:
    by_value: dict[str, list[Path]] = {}
    for path, p in parts:
        by_value.setdefault(json.dumps(p[key], sort_keys=True), []).append(path)
    if len(by_value) > 1:
        groups = "; ".join(_names(v) for v in by_value.values())
        raise InputError(_names([p for p, _ in parts]), f"parts differ in {what} ({groups})", fix)


def merge_parts(paths: list[Path], *, clock_align: str = "auto") -> dict:
    """The traces JSON of the whole folder from its parts: exactly what the unsharded analysis
    gives. Parts from different folders or dpscope versions, or overlapping or missing shards,
    raise one InputError line naming the files."""
    if not paths:
        raise InputError("merge", "no part files given", "pass part-*.json")
    parts = [(Path(p), _read_part(Path(p))) for p in paths]  # a file given twice overlaps
    _same(parts, "schema_version", "schema version", "re-run every shard with one dpscope version")
    _same(parts, "trace_dir", "trace folder", "merge only the parts of one trace folder")
    _same(
        parts, "files", "their trace file lists", "re-run every shard on the same, complete folder"
    )
    _same(parts, "shards", "shard count N", "run every shard with the same --shard K/N")
    first = parts[0][1]
    if first["schema_version"] != TRACES_PART_SCHEMA_VERSION:
        raise InputError(
            _names([p for p, _ in parts]),
            f"parts have schema version {first['schema_version']}, this dpscope reads "
            f"{TRACES_PART_SCHEMA_VERSION}",
            "re-run the shards with this dpscope version",
        )
    by_shard: dict[int, list[Path]] = {}
    for path, p in parts:
        by_shard.setdefault(int(p["shard"]), []).append(path)
    twice = {k: v for k, v in by_shard.items() if len(v) > 1}
    if twice:
        k, dup = min(twice.items())
        raise InputError(
            _names(dup), f"overlapping parts: shard {k} given {len(dup)} times", "pass each once"
        )
    n = int(first["shards"])
    missing = sorted(set(range(n)) - set(by_shard))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise InputError(
            _names([p for p, _ in parts]),
            f"missing shards {shown} of {n}",
            "run those shards (--shard K/N) and merge all N parts",
        )
    summaries = [summary_from_json(s, path) for path, p in parts for s in p["summaries"]]
    skipped = [s for _, p in parts for s in p["skipped"]]
    return combine_summaries(first["trace_dir"], summaries, skipped, clock_align=clock_align)
