"""Rank summaries as Parquet rows: the format of Parquet shard parts and of the trace cache.

One row per rank summary. Scalar fields are typed columns; the nested per-rank fields (per-step
rows, ops, memory, HTA and tb-profiler figures, warnings) are JSON text columns (NaN kept); the
collective calls, the bulk of a part, are Arrow columns: `instances` is a list of
{name, algorithm, union_us, start_us[], end_us[], latency_us[], device_us[], exposed_us[],
bytes[], group_size[], phase[]} (analysis.trace.collectives).
Float64 values round-trip exactly in both, so a merge of Parquet parts is byte-for-byte the
unsharded traces JSON. The file's key-value metadata holds `dpscope.schema_version` (the traces
JSON schema) and the part header or the cache key as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.trace.rank import RankSummary
from profiler.runfolder.errors import InputError

__all__ = ["META_KEY", "read_rows", "summary_from_json", "summary_table"]

_INT_ARRAYS = ("bytes", "group_size", "phase")  # every other instance array is float64 µs

META_KEY = b"dpscope.header"
_VERSION_KEY = b"dpscope.schema_version"
_INT = ("rank", "world_size", "origin_ns", "steps", "dropped_events", "orphan_kernels")
_INT += ("tb_split_steps",)
_STR = ("file", "rank_source", "backend", "kind", "host")
_CALL_FLOATS = ("start_us", "end_us", "latency_us", "device_us", "exposed_us")
_CALL_INTS = ("bytes", "group_size", "phase")
_INSTANCE = pa.struct(
    [
        ("name", pa.string()),
        ("algorithm", pa.string()),
        ("union_us", pa.float64()),
        *((k, pa.list_(pa.float64())) for k in _CALL_FLOATS),
        *((k, pa.list_(pa.int64())) for k in _CALL_INTS),
    ]
)


def _kind(field: str) -> pa.DataType:
    if field in _INT:
        return pa.int64()
    if field in _STR:
        return pa.string()
    if field == "instances":
        return pa.list_(_INSTANCE)
    if field.endswith(("_us", "_pct", "_us_mean")) and field not in ("ops_self_us_per_step",):
        return pa.float64()
    return pa.string()  # JSON text


def _instances(inst: dict[str, dict[str, Any]]) -> list[dict]:
    out = []
    for name, cols in inst.items():
        row = {
            "name": name,
            "algorithm": cols.get("algorithm"),
            "union_us": float(cols["union_us"]),
        }
        for k in (*_CALL_FLOATS, *_CALL_INTS):
            v = cols.get(k)
            row[k] = None if v is None else np.asarray(v).tolist()
        out.append(row)
    return out


def summary_table(
    summaries: list[RankSummary], header: dict[str, Any], schema_version: int
) -> pa.Table:
    """The summaries as one Parquet-ready table, `header` (JSON-able) in its metadata."""
    fields = RankSummary.__struct_fields__
    schema = pa.schema([(f, _kind(f)) for f in fields])
    cols: dict[str, list] = {f: [] for f in fields}
    for s in summaries:
        for f in fields:
            v = getattr(s, f)
            if f == "instances":
                v = _instances(v)
            elif _kind(f) == pa.string() and f not in _STR:
                v = json.dumps(msgspec.to_builtins(v) if isinstance(v, msgspec.Struct) else v,
                               allow_nan=True)  # fmt: skip
            cols[f].append(v)
    meta = {META_KEY: json.dumps(header).encode(), _VERSION_KEY: str(schema_version).encode()}
    return pa.table(cols, schema=schema).replace_schema_metadata(meta)


def read_rows(path: Path, schema_version: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, summaries as part-JSON dicts) of a Parquet file `summary_table` wrote; a file
    that is not one, or of another schema version, is one InputError line naming it."""
    try:
        table = pq.read_table(path)
        meta = table.schema.metadata or {}
        header = json.loads(meta[META_KEY])
        version = int(meta[_VERSION_KEY])
    except (OSError, KeyError, ValueError, pa.ArrowException) as err:
        problem = " ".join(str(err).split())[:160] or type(err).__name__
        raise InputError(
            path, f"is not a dpscope Parquet part ({problem})", "re-run that shard"
        ) from None
    if version != schema_version:
        raise InputError(
            path,
            f"is Parquet of schema version {version}, this dpscope reads {schema_version}",
            "re-run the shard (or the analysis) with this dpscope version",
        )
    rows = []
    for row in table.to_pylist():
        for f, v in row.items():
            if f == "instances":
                row[f] = {
                    i.pop("name"): {k: x for k, x in i.items() if x is not None} for i in v or []
                }
            elif _kind(f) == pa.string() and f not in _STR and v is not None:
                row[f] = json.loads(v)
        rows.append(row)
    return header, rows


def summary_from_json(summary: dict, path: Path) -> RankSummary:
    """The rank summary of a part's entry, the instance arrays back as numpy; a summary that is
    not one (a hand-edited or foreign part) is one InputError line naming the part."""
    try:
        out = msgspec.convert(summary, RankSummary)
        out.instances = {
            name: {
                k: np.asarray(v, dtype=np.int64 if k in _INT_ARRAYS else np.float64)
                if isinstance(v, list)
                else v
                for k, v in inst.items()
            }
            for name, inst in out.instances.items()
        }
    except (msgspec.ValidationError, ValueError, TypeError, OverflowError) as err:
        problem = " ".join(str(err).split())[:200]
        raise InputError(
            path, f"holds a broken rank summary ({problem})", "re-run that shard"
        ) from None
    for name, inst in out.instances.items():  # one call per index: every array as long
        if "end_us" not in inst or "start_us" not in inst:  # the clock alignment needs both
            raise InputError(
                path,
                f"holds no call start/end times for `{name}` (an older dpscope's part)",
                "re-run that shard with this dpscope",
            )
        sizes = {k: v.shape for k, v in inst.items() if isinstance(v, np.ndarray)}
        if len(set(sizes.values())) > 1 or any(len(s) != 1 for s in sizes.values()):
            raise InputError(
                path, f"holds ragged call arrays for `{name}` ({sizes})", "re-run that shard"
            )
    return out
