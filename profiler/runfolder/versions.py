"""The schema version of every file kind dpscope writes or reads, in one place.

Each file's `schema_version` field moves only with its own kind; a reader refuses a version it
does not know with one line (docs/reference/schemas.md, docs/reference/run-folder.md).
"""

from __future__ import annotations

__all__ = [
    "DIFF_JSON_SCHEMA_VERSION",
    "OPS_JSON_SCHEMA_VERSION",
    "PARQUET_TABLES_SCHEMA_VERSION",
    "PROJECTION_JSON_SCHEMA_VERSION",
    "READABLE_RUN_JSON_SCHEMAS",
    "RUNS_JSON_SCHEMA_VERSION",
    "RUN_JSON_SCHEMA_VERSION",
    "TRACES_JSON_SCHEMA_VERSION",
    "TRACES_PART_SCHEMA_VERSION",
    "TUNE_JSON_SCHEMA_VERSION",
]

RUN_JSON_SCHEMA_VERSION: int = 2
"""run.json of a run folder (training, script, recorder and comm runs), as written now."""
READABLE_RUN_JSON_SCHEMAS: tuple[int, ...] = (1, 2)
"""The run.json versions the typed reader accepts (1: steps.csv without `profiled`)."""
TUNE_JSON_SCHEMA_VERSION: int = 1
"""tune.json of a `dpscope tune` folder."""
TRACES_JSON_SCHEMA_VERSION: int = 2
"""The traces JSON of `dpscope traces` (one folder of per-rank traces)."""
TRACES_PART_SCHEMA_VERSION: int = 2
"""A sharded analysis part (`dpscope traces --shard K/N`, JSON or Parquet), merged by
`dpscope merge`; also the rows of the trace cache (`.dpscope-cache/`)."""
PARQUET_TABLES_SCHEMA_VERSION: int = 1
"""The Parquet result tables (steps, collectives, ops, memory) of `--parquet` and report folders."""
RUNS_JSON_SCHEMA_VERSION: int = 2
"""The runs JSON of `dpscope runs --json` and the report's summary.json."""
OPS_JSON_SCHEMA_VERSION: int = 1
"""The ops JSON of `dpscope ops --json`."""
DIFF_JSON_SCHEMA_VERSION: int = 1
"""The diff JSON of `dpscope diff --json`."""
PROJECTION_JSON_SCHEMA_VERSION: int = 1
"""The projection JSON of `dpscope project --json`."""
