"""The run-folder schema: every field of run.json (training and comm runs) and every steps.csv
row, as typed msgspec Structs with their ranges.

Declarative (one Struct per record and sub-record, one line per field), so it is exempt from the
400-line rule (tests/test_code_size.py). Readers decode through it (profiler.runfolder.records);
the rules are listed in docs/reference/run-folder.md. Unknown fields are ignored (newer writers
add optional fields), and every field older writers may lack is optional.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal, get_args

import msgspec

__all__ = [
    "Bytes",
    "CommConfig",
    "CommMean",
    "CommMetrics",
    "CommRecord",
    "Config",
    "Count",
    "DdpConfig",
    "DdpMetrics",
    "Env",
    "ErrorInfo",
    "Eval",
    "EvalEntry",
    "FINITE_MAX",
    "Flag",
    "FsdpConfig",
    "FsdpGroup",
    "FsdpMetrics",
    "HostLoad",
    "LeftOut",
    "MAX_ENTRIES",
    "MAX_RANKS",
    "MODES",
    "MemoryEntry",
    "Metrics",
    "Mode",
    "ModelFacts",
    "PathText",
    "Pct",
    "PROCESS_GROUP_MODES",
    "PerRank",
    "ProfileConfig",
    "ProfileExport",
    "REQUIRED_STEP_COLUMNS",
    "Rate",
    "RunRecord",
    "STATUSES",
    "Seconds",
    "Status",
    "StepRow",
    "StepTime",
]

# JSON cannot hold inf/NaN, but steps.csv cells can ("inf", "nan"): NaN fails `ge`, inf fails `le`.
FINITE_MAX = sys.float_info.max
Count = Annotated[int, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=FINITE_MAX)]
Rate = Annotated[float, msgspec.Meta(ge=0, le=FINITE_MAX)]
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


class FsdpGroup(msgspec.Struct):
    """One `metrics.fsdp.groups` item: the parameters one fully_shard call owns (one all-gather
    in forward, one reduce-scatter in backward)."""

    module: str  # qualified name ("" = the root)
    params: Count = 0  # parameter tensors
    numel: Count = 0  # elements, unpadded (the model's own)
    unsharded_bytes: Bytes = 0  # world × padded shard: the all-gather's output
    shard_bytes: Bytes = 0  # one rank's padded shard (what each rank keeps)


class FsdpMetrics(msgspec.Struct):
    """run.json `metrics.fsdp` (fsdp runs): the sharding as fully_shard made it."""

    world_size: Annotated[int, msgspec.Meta(ge=1)] | None = None
    groups: Annotated[list[FsdpGroup], msgspec.Meta(max_length=1_000_000)] = []


class FlightRecorderView(msgspec.Struct):
    """run.json `error.flight_recorder` (optional): what the ranks' flight-recorder dumps say
    (profiler.runfolder.frdiag, docs/reference/run-folder.md)."""

    message: str | None = None
    process_group: str | None = None
    seq: int | None = None
    collective: str | None = None
    entered: list[int] = []
    never_entered: list[int] = []
    waited_s: dict[str, float] = {}
    desync: list[dict[str, Any]] | None = None
    aborted: dict[str, str] = {}
    no_dump: list[int] = []
    dumps: list[str] = []
    problems: list[str] = []


class ErrorInfo(msgspec.Struct):
    message: str | None = None
    rank: int | None = None  # any integer: a writer may mark "no rank" its own way
    exit_code: int | None = None
    log_tail: list[str] = []
    flight_recorder: FlightRecorderView | None = None


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


Status = Literal["running", "ok", "failed", "skipped", "interrupted"]
STATUSES = get_args(Status)
# The data-parallel family: one device, nn.DataParallel, DDP (with ZeRO-1 as config.zero) and
# FSDP2 (fully_shard). The modes whose ranks are processes of one process group:
Mode = Literal["single", "dp", "ddp", "fsdp"]
MODES = get_args(Mode)
PROCESS_GROUP_MODES = ("ddp", "fsdp")


class FsdpConfig(msgspec.Struct):
    """run.json `config.fsdp` (fsdp runs): how the model was sharded."""

    # `default` (each element of the model's top-level ModuleList/Sequential containers), or the
    # --fsdp-wrap classes as given (MODULE:CLASS), or `seen` for a --script run.
    wrap: str | None = None
    reshard_after_forward: bool | None = None


class Config(msgspec.Struct):
    mode: Mode
    # Null only on a skipped run whose layout could not be decided (checked in read_record).
    world_size: Annotated[int, msgspec.Meta(ge=1)] | None
    backend: str | None = None
    nproc_per_node: Annotated[int, msgspec.Meta(ge=1)] | None = None
    devices: list[str] | None = []
    model: str | None = None
    dataset: str | None = None
    # The factories' keyword arguments (ints, floats, bools, strings) and the loss spec; absent
    # from records written before they existed (then: none, and cross_entropy, the only loss).
    model_args: dict[str, Any] | None = None
    dataset_args: dict[str, Any] | None = None
    loss: str | None = None
    model_facts: ModelFacts | None = None
    ddp: DdpConfig | None = None
    # ZeRO stage of a DDP run's optimizer (1: ZeroRedundancyOptimizer); absent before it existed.
    zero: Annotated[int, msgspec.Meta(ge=0, le=1)] | None = None
    fsdp: FsdpConfig | None = None
    profile: ProfileConfig | None = None
    global_batch: Annotated[int, msgspec.Meta(ge=1)] | None = None
    per_device_batch: Annotated[int, msgspec.Meta(ge=1)] | None = None
    scaling: Literal["strong", "weak"] | None = None
    amp: str | None = None
    seed: int | None = None
    # ranks on one host (the launcher's plan; a recorded run's ranks), for the cores a run uses
    nproc_per_node: Count | None = None
    warmup_steps: Count | None = None
    eval_batches: Count | None = None  # --eval-batches (0 = the whole test split); newer runs
    sweep_id: str | None = None
    # `--repeat` rounds: the set of rounds (one id) and this run's round in it, from 0
    repeat_id: str | None = None
    repeat_round: Count | None = None
    # A `--script` / RunRecorder run: what it ran (the same-workload key, docs/reference/metrics.md).
    workload: str | None = None
    script: str | None = None


class Env(msgspec.Struct):
    os: str | None = None
    hostname: str | None = None
    platform: str | None = None
    python: str | None = None
    torch: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    gpus: list[str] = []
    cpu_model: str | None = None
    cpu_cores: Count | None = None
    threads_per_rank: Annotated[int, msgspec.Meta(ge=1)] | None = None
    host_load: HostLoad | None = None
    # Total memory of one device (the first GPU, or the host's RAM for CPU runs), bytes.
    device_memory_bytes: Bytes | None = None


class StepTime(msgspec.Struct):
    mean: Seconds | None = None
    p50: Seconds | None = None
    p95: Seconds | None = None


class MemoryEntry(msgspec.Struct):
    rank: Count | None = None
    device: str | None = None
    peak_allocated_bytes: Count | None = None
    peak_reserved_bytes: Count | None = None
    nvml_used_bytes: Count | None = None
    peak_rss_bytes: Count | None = None


class PerRank(msgspec.Struct):
    rank: Count
    steps: Count | None = None
    samples_per_s: Rate | None = None
    step_time_s_mean: Seconds | None = None
    step_time_s_p50: Seconds | None = None
    step_time_s_p95: Seconds | None = None


class ProfileExport(msgspec.Struct):
    """One rank's `metrics.profile` entry: seconds its profiler spent exporting traces."""

    rank: Count
    export_s: Seconds | None = None


class LeftOut(msgspec.Struct):
    """A run.json `traces_left_out` entry: a trace on disk that is not part of the run, and why."""

    file: PathText
    reason: str = ""


class Metrics(msgspec.Struct):
    samples_per_s: Rate | None = None
    step_time_s: StepTime | None = None
    per_rank: Annotated[list[PerRank], msgspec.Meta(max_length=MAX_ENTRIES)] = []
    epoch_time_s: list[Seconds] = []
    wall_time_s: Seconds | None = None
    memory: Annotated[list[MemoryEntry], msgspec.Meta(max_length=MAX_ENTRIES)] = []
    memory_after_first_step: Annotated[list[MemoryEntry], msgspec.Meta(max_length=MAX_ENTRIES)] = []
    memory_breakdown: Annotated[list[dict[str, Any]], msgspec.Meta(max_length=MAX_ENTRIES)] = []
    ddp: DdpMetrics | None = None
    fsdp: FsdpMetrics | None = None
    param_grad_bytes: Annotated[list[Bytes], msgspec.Meta(max_length=10_000_000)] | None = None
    buffer_bytes_by_dtype: dict[str, Bytes] | None = None
    # schema 2: (profiled ÷ unprofiled mean step time − 1) × 100 ≥ −100; may be negative (noise)
    profiler_overhead_pct: Annotated[float, msgspec.Meta(ge=-100, le=FINITE_MAX)] | None = None
    # Newer runs: two standard errors of that overhead (%), and each rank's trace export time.
    profiler_overhead_noise_pct: Seconds | None = None
    profile: Annotated[list[ProfileExport], msgspec.Meta(max_length=MAX_ENTRIES)] = []


class EvalEntry(msgspec.Struct):
    epoch: Count | None = None
    # Finite; negative only from a user's --loss (a log-likelihood may be below 0).
    test_loss: Annotated[float, msgspec.Meta(ge=-FINITE_MAX, le=FINITE_MAX)] | None = None
    top1_pct: Pct | None = None
    top5_pct: Pct | None = None
    samples: Count | None = None
    # Sequence outputs: exp(mean token cross-entropy) and the tokens scored; `output` is what
    # the eval could score (class_scores | sequence | other).
    perplexity: Annotated[float, msgspec.Meta(ge=1, le=FINITE_MAX)] | None = None
    tokens: Count | None = None
    output: Literal["class_scores", "sequence", "other"] | None = None


class Eval(msgspec.Struct):
    epochs: list[EvalEntry] = []
    best: EvalEntry | None = None
    note: str | None = None  # why the run has no eval (a dataset without a test split)
    split_samples: Count | None = None  # the test split's size (newer runs; --eval-batches caps)


class RunRecord(msgspec.Struct):
    """run.json (docs/reference/run-folder.md): only the fields analysis reads are typed; others pass."""

    schema_version: int
    status: Status
    config: Config
    run_id: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    created_at: str | None = None
    finished_at: str | None = None
    error: ErrorInfo | None = None
    env: Env = msgspec.field(default_factory=Env)
    metrics: Metrics = msgspec.field(default_factory=Metrics)
    eval: Eval = msgspec.field(default_factory=Eval)
    traces: list[PathText] = []
    # Newer script runs: traces on disk that the record leaves out, each with its reason.
    traces_left_out: Annotated[list[LeftOut], msgspec.Meta(max_length=MAX_ENTRIES)] = []
    warnings: list[str] = []  # schema 2: the writer's own warnings (e.g. no unprofiled step)
    stop_reason: str | None = None  # newer script runs: "stopped after --max-steps N"


class StepRow(msgspec.Struct):
    """One steps.csv row; `profiled` (schema_version 2), `profiler_s` and `other_cpu_cores` are
    optional."""

    rank: Count
    step: Count
    warmup: Flag
    step_time_s: Seconds
    data_s: Seconds
    forward_s: Seconds
    backward_s: Seconds
    optimizer_s: Seconds
    epoch: Count | None = None
    samples: Count | None = None
    loss: float | None = None
    rss_bytes: Count | None = None
    cuda_allocated_bytes: Count | None = None
    profiled: Flag | None = None
    # Newer runs: the profiler's own seconds at the step's end, inside step_time_s.
    profiler_s: Seconds | None = None
    # cores' worth of CPU other processes used during the step (rank 0's rows; newer runs)
    other_cpu_cores: Annotated[float, msgspec.Meta(ge=0, le=FINITE_MAX)] | None = None


# The columns every steps.csv must have (StepRow's required fields); the others may be empty.
REQUIRED_STEP_COLUMNS = StepRow.__struct_fields__[: -len(StepRow.__struct_defaults__)]


class CommConfig(msgspec.Struct):
    backend: str | None = None
    world_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_RANKS)] | None = None
    devices: list[str] | None = []
    gap_ms: dict[str, Annotated[float, msgspec.Meta(ge=0, le=FINITE_MAX)]] | None = None


class CommMean(msgspec.Struct):
    """One `metrics.time_us_mean` item of a comm run."""

    collective: str
    bytes: Count
    time_us_mean: Seconds | None = None
    time_us_mean_back_to_back: Seconds | None = None


class CommMetrics(msgspec.Struct):
    """A comm run's `metrics`: what it skipped and its mean times (medians are in comm.csv)."""

    skipped: list[Any] = []
    time_us_mean: Annotated[list[CommMean], msgspec.Meta(max_length=100_000)] = []


class CommRecord(msgspec.Struct):
    """run.json of a `make bench-comm` run folder (`kind: "comm"`, docs/reference/metrics.md §10):
    the fields readers decide on are typed (config, metrics); others pass as written."""

    kind: Literal["comm"]
    status: Status
    schema_version: int | None = None  # hand-made comm folders may lack it: read as current
    config: CommConfig = msgspec.field(default_factory=CommConfig)
    metrics: CommMetrics = msgspec.field(default_factory=CommMetrics)
    run_id: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    error: ErrorInfo | None = None
    env: Env = msgspec.field(default_factory=Env)  # newer runs: env.host_load during the timing
