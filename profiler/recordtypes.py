"""The leaf types of the typed run.json records (profiler.records): the range-checked number
types, the per-rank list bounds and the small sub-records (`config.ddp`, `config.profile`,
`config.model_facts`, `metrics.ddp`, `env.host_load`, `error`). Rules: docs/reference/run-folder.md.

Split from profiler.records for length; that module re-exports every name here that readers use.
"""

from __future__ import annotations

import sys
from typing import Annotated

import msgspec

__all__ = [
    "MAX_ENTRIES",
    "MAX_RANKS",
    "Bytes",
    "Count",
    "DdpConfig",
    "DdpMetrics",
    "ErrorInfo",
    "Flag",
    "HostLoad",
    "ModelFacts",
    "PathText",
    "Pct",
    "ProfileConfig",
    "Rate",
    "Seconds",
]

# JSON cannot hold inf/NaN, but steps.csv cells can ("inf", "nan"): NaN fails `ge`, inf fails `le`.
_FINITE_MAX = sys.float_info.max
Count = Annotated[int, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=_FINITE_MAX)]
Rate = Annotated[float, msgspec.Meta(ge=0, le=_FINITE_MAX)]
Pct = Annotated[float, msgspec.Meta(ge=0, le=100)]
Flag = Annotated[int, msgspec.Meta(ge=0, le=1)]
PathText = Annotated[str, msgspec.Meta(max_length=4096)]
# Bounds on per-rank lists (docs/reference/run-folder.md): one entry per rank and device, so far
# more than any job has ranks; a longer list is refused instead of making the report's work
# unbounded.
MAX_RANKS = 16_384
MAX_ENTRIES = 2 * MAX_RANKS
Bytes = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class DdpConfig(msgspec.Struct):
    """run.json `config.ddp`: the DDP settings the projection reads."""

    bucket_cap_mb: Annotated[float, msgspec.Meta(gt=0, le=1e6)] | None = None
    comm_hook: str | None = None
    # The first bucket's limit DDP used (written since its first-bucket rule changed with torch).
    first_bucket_bytes: Annotated[int, msgspec.Meta(ge=1)] | None = None


class ProfileConfig(msgspec.Struct):
    """run.json `config.profile`: the profiler schedule (profiler.session.ProfileConfig)."""

    enabled: bool = True
    wait: Count = 0
    warmup: Count = 0
    active: Count = 0
    repeat: Count = 0


class DdpMetrics(msgspec.Struct):
    """run.json `metrics.ddp` (null outside DDP): the reducer's bucket layout."""

    num_buckets: Count | None = None
    bucket_sizes_bytes: Annotated[list[Bytes], msgspec.Meta(max_length=1_000_000)] = []
    grad_bytes_total: Bytes | None = None
    param_count: Count | None = None


class ErrorInfo(msgspec.Struct):
    message: str | None = None
    rank: int | None = None  # any integer: a writer may mark "no rank" its own way
    exit_code: int | None = None
    log_tail: list[str] = []


class ModelFacts(msgspec.Struct):
    """config.model_facts: the model's size and one micro-batch's shapes."""

    parameters: Count | None = None
    trainable_parameters: Count | None = None
    num_classes: Count | None = None
    has_test_split: bool | None = None
    input_shape: list[Count] | None = None
    input_dtype: str | None = None
    target_shape: list[Count] | None = None
    target_dtype: str | None = None


class HostLoad(msgspec.Struct):
    """env.host_load (optional): how busy the machine was while the run measured its steps."""

    load_avg_1m_start: Annotated[float, msgspec.Meta(ge=0)] | None = None
    load_avg_1m_end: Annotated[float, msgspec.Meta(ge=0)] | None = None
    # cores' worth of CPU used by other processes during the measured steps
    other_cpu_cores_mean: Annotated[float, msgspec.Meta(ge=0)] | None = None
    steal_pct: Pct | None = None
    cores: Count | None = None
    own_threads: Count | None = None
