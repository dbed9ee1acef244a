"""Columnar results: the traces analysis as four Parquet tables (docs/reference/schemas.md#parquet-tables),
for DuckDB, Polars or pandas to query without loading everything.

- `steps.parquet`: one row per (run, rank, analysed step): the per-step split (µs);
- `collectives.parquet`: one row per collective call per rank (the traces JSON's `calls`): times on
  the job's common clock (µs), latency, device, transfer and sync time (µs), bytes, group size;
- `ops.parquet`: one row per (run, rank, operator): calls, self and total µs per step, % of step;
- `memory.parquet`: the allocated-bytes timeline per (run, rank, device) as the JSON has it.

Units are in the column names. Every file carries `dpscope.table` and `dpscope.schema_version`
(PARQUET_TABLES_SCHEMA_VERSION) in its key-value metadata; `load_table` refuses another version with one
line. `dpscope traces DIR --parquet OUT` writes them for one trace folder (run_id = the folder as
given); every report folder holds them for all its runs.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from profiler.runfolder.errors import InputError
from profiler.runfolder.versions import PARQUET_TABLES_SCHEMA_VERSION

__all__ = [
    "TABLES",
    "load_table",
    "run_tables",
    "runs_json_tables",
    "table_bytes",
    "trace_tables",
    "write_tables",
]

_F, _I, _S = pa.float64(), pa.int64(), pa.string()
_SCHEMAS: dict[str, list[tuple[str, pa.DataType]]] = {
    "steps": [("run_id", _S), ("rank", _I), ("step", _I), ("step_time_us", _F), ("compute_us", _F),
              ("comm_us", _F), ("exposed_comm_us", _F), ("overlap_us", _F), ("busy_us", _F),
              ("idle_us", _F), ("data_wait_us", _F)],
    "collectives": [("run_id", _S), ("rank", _I), ("name", _S), ("call_index", _I),
                    ("start_us", _F), ("end_us", _F), ("latency_us", _F), ("device_us", _F),
                    ("transfer_us", _F), ("sync_us", _F), ("bytes", _I), ("group_size_ranks", _I)],
    "ops": [("run_id", _S), ("rank", _I), ("name", _S), ("kind", _S), ("calls_per_step", _F),
            ("self_us_per_step", _F), ("total_us_per_step", _F), ("pct_of_step", _F)],
    "memory": [("run_id", _S), ("rank", _I), ("device", _S), ("t_us", _F),
               ("allocated_bytes", _I)],
}  # fmt: skip
TABLES = tuple(_SCHEMAS)
_CALL_RENAME = {"call": "call_index", "group_size": "group_size_ranks"}


def _steps(run_id: str, ranks: list[dict]) -> Iterable[dict]:
    for r in ranks:
        for s in r.get("per_step") or []:
            yield {"run_id": run_id, "rank": r["rank"], **s}


def _ops(run_id: str, ranks: list[dict]) -> Iterable[dict]:
    for r in ranks:
        for o in r.get("ops") or []:
            yield {"run_id": run_id, "rank": r["rank"], **o}


def _memory(run_id: str, ranks: list[dict]) -> Iterable[dict]:
    for r in ranks:
        for d in (r.get("memory") or {}).get("devices") or []:
            line = d.get("timeline") or {}
            for t, b in zip(line.get("t_us") or [], line.get("allocated_bytes") or [], strict=True):
                yield {"run_id": run_id, "rank": r["rank"], "device": d["device"], "t_us": t,
                       "allocated_bytes": b}  # fmt: skip


def _calls(run_id: str, calls: dict[str, Any] | None) -> dict[str, Any]:
    calls = calls or {}
    n = len(calls.get("rank", []))
    return {"run_id": [run_id] * n, **{_CALL_RENAME.get(k, k): v for k, v in calls.items()}}


def _table(name: str, cols: dict[str, Any]) -> pa.Table:
    schema = pa.schema(_SCHEMAS[name])
    n = max((len(v) for v in cols.values()), default=0)
    arrays = [
        pa.array(cols.get(f, [None] * n), type=t, from_pandas=True) for f, t in _SCHEMAS[name]
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _columns(records: Iterable[dict], name: str) -> dict[str, list]:
    keys = [f for f, _ in _SCHEMAS[name]]
    cols: dict[str, list] = {k: [] for k in keys}
    for rec in records:
        for k in keys:
            cols[k].append(rec.get(k))
    return cols


def trace_tables(result: dict[str, Any], run_id: str | None = None) -> dict[str, pa.Table]:
    """The four tables of one traces result (`run_id` defaults to its trace_dir)."""
    return run_tables([(run_id or str(result["trace_dir"]), result)])


def run_tables(results: Iterable[tuple[str, dict[str, Any] | None]]) -> dict[str, pa.Table]:
    """The four tables over several (run_id, traces result) pairs (a run without traces adds no
    rows; the collectives rows come from each TracesResult's `calls`)."""
    parts: dict[str, list[pa.Table]] = {n: [_table(n, {})] for n in TABLES}
    for run_id, result in results:
        if not result:
            continue
        ranks = result.get("ranks") or []
        parts["steps"].append(_table("steps", _columns(_steps(run_id, ranks), "steps")))
        parts["ops"].append(_table("ops", _columns(_ops(run_id, ranks), "ops")))
        parts["memory"].append(_table("memory", _columns(_memory(run_id, ranks), "memory")))
        calls = _calls(run_id, getattr(result, "calls", None))
        parts["collectives"].append(_table("collectives", calls))
    meta = {b"dpscope.schema_version": b"%d" % PARQUET_TABLES_SCHEMA_VERSION}
    return {
        n: pa.concat_tables(ts).replace_schema_metadata({**meta, b"dpscope.table": n.encode()})
        for n, ts in parts.items()
    }


def runs_json_tables(data: dict[str, Any]) -> dict[str, pa.Table]:
    """The four tables over the runs of a runs JSON as `compare_runs` returns it (each run's
    `trace` still the TracesResult that carries `calls`); a run without traces adds no rows."""
    runs = data.get("runs") or []
    return run_tables((r["run_id"], r.get("trace")) for r in runs if r.get("run_id"))


def table_bytes(table: pa.Table) -> bytes:
    """The Parquet file of `table` as bytes (the report writes them with its other files)."""
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def write_tables(tables: dict[str, pa.Table], out_dir: Path) -> list[Path]:
    """Write `<out_dir>/<name>.parquet` for each table, each atomically; returns the paths."""
    from profiler.runfolder.atomic import atomic_path

    out_dir = Path(out_dir)
    paths = []
    for name, table in tables.items():
        path = out_dir / f"{name}.parquet"
        try:
            with atomic_path(path) as tmp:
                tmp.write_bytes(table_bytes(table))
        except OSError as err:
            raise InputError(
                path,
                f"cannot write the Parquet ({err.strerror})",
                "pass a writable --parquet folder",
            ) from None
        paths.append(path)
    return paths


def load_table(path: Path | str, name: str) -> pd.DataFrame:
    """Table `name` as a DataFrame from `path`: its .parquet file, or a folder holding
    `<name>.parquet` (a `--parquet` folder or a report folder). Another schema version, a file
    that is not this table, or none at all, is one InputError line."""
    path = Path(path)
    file = path / f"{name}.parquet" if path.is_dir() else path
    fix = f"write it with `dpscope traces DIR --parquet {file.parent}` or `dpscope report`"
    try:
        meta = pq.read_schema(file).metadata or {}
    except FileNotFoundError:
        raise InputError(file, "does not exist", fix) from None
    except (OSError, pa.ArrowException) as err:
        problem = " ".join(str(err).split())[:160]
        raise InputError(file, f"is not a Parquet file ({problem})", fix) from None
    table, version = meta.get(b"dpscope.table"), meta.get(b"dpscope.schema_version")
    if table != name.encode():
        what = table.decode(errors="replace") if table else "no dpscope table"
        raise InputError(file, f"holds {what!r}, not the {name} table", fix)
    if version != b"%d" % PARQUET_TABLES_SCHEMA_VERSION:
        shown = version.decode(errors="replace") if version else "none"
        raise InputError(
            file,
            f"is Parquet of table schema version {shown}, this dpscope reads {PARQUET_TABLES_SCHEMA_VERSION}",
            f"re-write it with this dpscope version ({fix.removeprefix('write it with ')})",
        )
    return pq.read_table(file).to_pandas()
