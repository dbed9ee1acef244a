"""run.json and steps.csv validated at the boundary, once: the typed msgspec Structs and the
columnar steps.csv reader (profiler.steps).

They live below both halves in profiler.records (the launcher and the tools read run folders
too, and workloads/ must not import analysis); this module is analysis's name for them.
"""

from __future__ import annotations

from profiler.records import (
    REQUIRED_STEP_COLUMNS,
    STATUSES,
    CommRecord,
    Config,
    Env,
    EvalEntry,
    HostLoad,
    InvalidRecord,
    Metrics,
    RunRecord,
    StepRow,
    StepTime,
    read_comm_record,
    read_record,
)
from profiler.steps import read_steps, read_steps_frame

__all__ = [
    "REQUIRED_STEP_COLUMNS",
    "STATUSES",
    "CommRecord",
    "Config",
    "Env",
    "EvalEntry",
    "HostLoad",
    "InvalidRecord",
    "Metrics",
    "RunRecord",
    "StepRow",
    "StepTime",
    "read_comm_record",
    "read_record",
    "read_steps",
    "read_steps_frame",
]
