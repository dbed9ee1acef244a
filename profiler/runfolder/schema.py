"""The run-folder schema: every field of run.json (training, script, recorder and comm runs), of a
rank's part file and of a steps.csv row, as typed msgspec Structs with their ranges.

One set of Structs serves both directions:

- **writers** build a record with `Struct.written(...)`: a field not given is absent from the
  file (UNSET), so each writer writes exactly the fields it knows, and `write_run_json` /
  `write_part` (profiler.runfolder.layout, .parts) accept nothing but these Structs;
- **readers** decode through them (profiler.runfolder.records): a field absent from the file
  reads as its default, unknown fields are ignored (newer writers add optional fields), and
  every field older writers may lack is optional. A writer that updates a record it read
  (`read_record_to_update`) keeps absent fields absent.

The fields are declared in the order writers write them (the order of the keys in the file), each
with its docstring: docs/reference/run-folder.md's field tables are generated from them
(`python -m bench.docs`). Declarative (one Struct per record and sub-record), so it is exempt
from the 400-line rule (tests/test_code_size.py).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self, get_args

import msgspec
from msgspec import UNSET

__all__ = [
    "BreakdownEntry",
    "Bytes",
    "CommConfig",
    "CommFit",
    "CommMean",
    "CommMetrics",
    "CommRunRecord",
    "Config",
    "Contention",
    "Count",
    "DdpConfig",
    "DdpMetrics",
    "Env",
    "ErrorInfo",
    "Eval",
    "EvalEntry",
    "FINITE_MAX",
    "Flag",
    "FlightRecorderView",
    "FsdpConfig",
    "FsdpGroup",
    "FsdpMetrics",
    "HostLoad",
    "IdlePenalty",
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
    "ProfileExport",
    "ProfileSettings",
    "RankPart",
    "REQUIRED_STEP_COLUMNS",
    "Rate",
    "Resume",
    "RunRecord",
    "STATUSES",
    "Schema",
    "Seconds",
    "SkippedCollective",
    "Status",
    "StepRow",
    "StepTime",
    "TraceExport",
    "Waiting",
    "as_written",
]

# JSON cannot hold inf/NaN, but steps.csv cells can ("inf", "nan"): NaN fails `ge`, inf fails `le`.
FINITE_MAX = sys.float_info.max
Count = Annotated[int, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=FINITE_MAX)]
Rate = Annotated[float, msgspec.Meta(ge=0, le=FINITE_MAX)]
Pct = Annotated[float, msgspec.Meta(ge=0, le=100)]
Flag = Annotated[int, msgspec.Meta(ge=0, le=1)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
PathText = Annotated[str, msgspec.Meta(max_length=4096)]
# Bounds on per-rank lists (docs/reference/run-folder.md): one entry per rank and device, so far
# more than any job has ranks; a longer list is refused instead of making the report's work
# unbounded.
MAX_RANKS = 16_384
MAX_ENTRIES = 2 * MAX_RANKS
Bytes = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Status = Literal["running", "ok", "failed", "skipped", "interrupted"]
STATUSES = get_args(Status)
# The data-parallel family: one device, nn.DataParallel, DDP (with ZeRO-1 as config.zero) and
# FSDP2 (fully_shard). The modes whose ranks are processes of one process group:
Mode = Literal["single", "dp", "ddp", "fsdp"]
MODES = get_args(Mode)
PROCESS_GROUP_MODES = ("ddp", "fsdp")


class Schema(msgspec.Struct, kw_only=True):
    """The base of every Struct here: keyword fields, in the order they are written."""

    @classmethod
    def written(cls, **given: Any) -> Self:
        """The record as a writer writes it: the fields `given`; every other field with a default
        is absent from the file (UNSET), and a required one missing is a TypeError."""
        absent = {f.name: UNSET for f in msgspec.structs.fields(cls) if not f.required}
        return cls(**(absent | given))

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> Self:
        """The record of a mapping a writer gathered (e.g. an error from a rank's error file):
        converted and checked against the types, nested records typed, and the fields absent
        from `fields` absent from the file too."""
        return as_written(msgspec.convert(fields, cls), fields)


def as_written(rec: Any, raw: Any) -> Any:
    """`rec`, decoded from `raw`, with each Struct field whose key `raw` lacks set to UNSET (at
    every depth): encoded again it gives `raw`'s keys, not the readers' defaults."""
    if isinstance(rec, msgspec.Struct) and isinstance(raw, Mapping):
        for field in msgspec.structs.fields(rec):
            if field.encode_name not in raw:
                setattr(rec, field.name, UNSET)
            else:
                as_written(getattr(rec, field.name), raw[field.encode_name])
    elif isinstance(rec, list) and isinstance(raw, list):
        for item, raw_item in zip(rec, raw, strict=False):
            as_written(item, raw_item)
    elif isinstance(rec, dict) and isinstance(raw, Mapping):
        for key, value in rec.items():
            as_written(value, raw.get(key))
    return rec


# -- run.json: the error ------------------------------------------------------------------------


class Waiting(Schema, kw_only=True):
    """A hang's `error.waiting[]` entry: where one rank was when the job stopped progressing."""

    rank: int | None = None
    """The rank."""
    step: int | None = None
    """Its last step."""
    phase: str | None = None
    """Its last phase (the heartbeat's: init, data, forward, backward, optimizer, ...)."""
    collective: str | None = None
    """The collective it waited in, null when it waited in none."""
    seq: int | None = None
    """That collective's number on this rank (equal `seq` on two ranks: the same collective)."""
    waited_s: float | None = None
    """Seconds since its last progress, s."""


class FlightRecorderView(Schema, kw_only=True):
    """run.json `error.flight_recorder` (DDP runs that left flight-recorder dumps, any kind):
    what the ranks' dumps say (profiler.runfolder.frdiag builds it from the dumps,
    workloads.launch.frexplain joins it to the heartbeats)."""

    message: str | None = None
    """The sentence a `hang` or `desync` message leads with, e.g. `rank 1 never entered
    all_reduce #57 (ranks 0, 2, 3 waited 300 s)`."""
    process_group: str | None = None
    """The group of the first collective where the dumped ranks disagree (when they agree, of
    the furthest rank's last one)."""
    seq: int | None = None
    """That collective's sequence number in its group."""
    collective: str | None = None
    """That collective, the op without the backend prefix."""
    entered: list[int] = []
    """The ranks whose dump holds that collective."""
    never_entered: list[int] = []
    """The ranks whose last entry is older (they never reached it)."""
    waited_s: dict[str, float] = {}
    """`{rank: seconds}` from entering it to dumping, for ranks still inside it or whose entry
    ended in the error they dumped after, s."""
    desync: list[dict[str, Any]] | None = None
    """Null, or per rank that entered it `{rank, op, input_sizes, output_sizes, dtypes}` when
    they differ; a rank gloo aborted (`aborted`) is `{rank, op: null, received_bytes,
    expected_bytes}` from gloo's line: the bytes it was sent and those its buffer held (null
    where the line gives none)."""
    aborted: dict[str, str] = {}
    """`{rank: gloo's mismatch line}`: gloo ends such a rank at once (SIGABRT), so it leaves no
    dump."""
    no_dump: list[int] = []
    """Ranks without a usable dump."""
    dumps: list[str] = []
    """The dump files read."""
    problems: list[str] = []
    """One line per dump file that was not read (truncated, from another job, a rank outside
    the world) and per rank without a dump."""


class ErrorInfo(Schema, kw_only=True):
    """run.json `error`: why the run failed, was skipped or interrupted (null otherwise). `rank`
    and `exit_code` are null when unknown; the extra fields of each `kind` are listed under
    "error.kind"."""

    kind: str | None = None
    """What happened: crash, killed, oom, diverged, hang, desync, interrupted, disk (see
    "error.kind"); absent on a skipped run and in older records."""
    signal: str | None = None
    """`interrupted`: the signal, SIGINT or SIGTERM."""
    message: str | None = None
    """One line: what failed (cut at 2,000 characters); a skipped run's reason."""
    rank: int | None = None  # any integer: a writer may mark "no rank" its own way
    """The first rank that failed (a rank ended by a signal other than torchrun's SIGTERM
    first, else the earliest error file of the last attempt); `interrupted`: the rank the signal
    reached first, null when it reached the launcher; `hang`: the first stuck rank."""
    exit_code: int | None = None
    """That rank's exit code (negative: killed by that signal); `interrupted`: 130 or 143."""
    ranks: list[int] | None = None
    """`hang`: every stuck rank."""
    step: int | None = None
    """`diverged`: the step of the non-finite loss; `hang`: the stuck rank's step."""
    phase: str | None = None
    """`hang`: the stuck rank's phase."""
    collective: str | None = None
    """`hang`: the collective the others waited in."""
    waiting: list[Waiting] | None = None
    """`hang`: per rank, where it was (Waiting)."""
    value: str | None = None
    """`diverged`: the loss, `"nan"`, `"inf"` or `"-inf"`."""
    per_device_batch: int | None = None
    """`oom`: the per-device batch that ran out of memory."""
    log_tail: list[str] = []
    """The last 20 lines of the failing rank's log (each cut at 500 characters); [] when
    interrupted."""
    flight_recorder: FlightRecorderView | None = None
    """What the ranks' flight-recorder dumps say (FlightRecorderView; DDP runs that left
    dumps)."""


# -- run.json: config ---------------------------------------------------------------------------


class ModelFacts(Schema, kw_only=True):
    """config.model_facts: the model's size and one micro-batch's shapes as the model sees them
    on one device (what the launcher and rank 0 built)."""

    parameters: Count | None = None
    """Parameters (tied weights once)."""
    trainable_parameters: Count | None = None
    """Parameters with `requires_grad`."""
    num_classes: Count | None = None
    """Classes of the dataset; null when it does not say."""
    has_test_split: bool | None = None
    """Whether the dataset has a test split (no eval without one)."""
    input_shape: list[Count] | None = None
    """One micro-batch's input shape; null for a non-tensor value."""
    input_dtype: str | None = None
    """Its dtype."""
    target_shape: list[Count] | None = None
    """One micro-batch's target shape; null for a non-tensor value."""
    target_dtype: str | None = None
    """Its dtype."""


class DdpConfig(Schema, kw_only=True):
    """run.json `config.ddp`: the DDP settings (written in every mode)."""

    bucket_cap_mb: Annotated[float, msgspec.Meta(gt=0, le=1e6)] | None = None
    """`--bucket-cap-mb`, MB."""
    # The first bucket's limit DDP used (written since its first-bucket rule changed with torch).
    first_bucket_bytes: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """The limit of DDP's first bucket (the last gradients to become ready) with this torch,
    bytes: `bucket_cap_mb` where an explicit cap sets it too, else 1 MiB; the projection buckets
    single runs with it. Absent in older runs."""
    gradient_as_bucket_view: bool | None = None
    """`--gradient-as-bucket-view`."""
    static_graph: bool | None = None
    """`--static-graph`."""
    find_unused_parameters: bool | None = None
    """`--find-unused-parameters`."""
    comm_hook: str | None = None
    """`--comm-hook`: none, fp16, bf16, powersgd."""


class FsdpConfig(Schema, kw_only=True):
    """run.json `config.fsdp` (fsdp runs, else null): how the model was sharded."""

    # `default` (each element of the model's top-level ModuleList/Sequential containers), or the
    # --fsdp-wrap classes as given (MODULE:CLASS), or `seen` for a --script run.
    wrap: str | None = None
    """`default` (each element of the model's top-level ModuleList/Sequential containers, then
    the root), the `--fsdp-wrap` classes as given (MODULE:CLASS), or `seen` for a `--script`
    run (the script called fully_shard itself)."""
    reshard_after_forward: bool | None = None
    """`--fsdp-reshard-after-forward` (a script run: what its fully_shard calls used; null when
    it cannot be told)."""


class ProfileSettings(Schema, kw_only=True):
    """run.json `config.profile`: the profiler schedule and options (profiler.session.ProfileConfig)."""

    enabled: bool = True
    """False with `--no-profile`."""
    wait: Count = 0
    """Steps skipped at the start of each cycle."""
    warmup: Count = 0
    """Steps traced but discarded at the start of each cycle."""
    active: Count = 0
    """Steps recorded into one trace per cycle."""
    repeat: Count = 0
    """Cycles; 0 repeats until the run ends."""
    record_shapes: bool | None = None
    """Operator input shapes recorded."""
    profile_memory: bool | None = None
    """Tensor allocations and frees recorded."""
    with_stack: bool | None = None
    """Python stacks recorded."""


class Config(Schema, kw_only=True):
    """run.json `config`: what was asked for and the layout the planner decided
    (workloads/plan.py). A `--script` or RunRecorder run writes `mode`, `backend`, `world_size`
    and `devices` as detected (what happened, not what was asked), `model` as the trained
    module's class, its own fields (`param_count`, `workload`, `script`, ...) and nulls for what
    the script decides (`dataset`, `scaling`, `amp`, `seed`). A `skipped` run has no layout:
    `devices`, `global_batch` and `per_device_batch` are null, and `world_size` /
    `nproc_per_node` too when the request did not fix them."""

    mode: Mode
    """`--mode`: single, dp, ddp (ZeRO-1 is `ddp` with `zero` 1) or fsdp."""
    backend: str | None = None
    """nccl, gloo, or none (single and dp)."""
    # Null only on a skipped run whose layout could not be decided (checked in read_record).
    world_size: Annotated[int, msgspec.Meta(ge=1)] | None
    """Model replicas: DDP processes over all nodes, the GPUs DataParallel spreads over, 1 for
    single."""
    nnodes: Positive | None = None
    """Nodes of the job (`--nnodes`; RunRecorder and `--script` runs: the hosts its ranks named,
    null when a rank left no part or named no host)."""
    nproc_per_node: Positive | None = None
    """Processes per node."""
    devices: list[str] | None = []
    """One per model replica: `["cpu"]`, `["cpu", "cpu"]` for 2 CPU ranks, `["cuda:0",
    "cuda:1"]`."""
    model: str | None = None
    """The model spec as given (`resnet18`, `torchvision:mobilenet_v3_small`,
    `mypkg.nets:build`; docs/guides/own-model.md); a script run: the trained module's class."""
    param_count: Count | None = None
    """A script or RunRecorder run: the trained module's parameters."""
    # The factories' keyword arguments (ints, floats, bools, strings) and the loss spec; absent
    # from records written before they existed (then: none, and cross_entropy, the only loss).
    model_args: dict[str, Any] | None = None
    """The model factory's keyword arguments (`{}` for none)."""
    dataset: str | None = None
    """The dataset spec as given."""
    dataset_args: dict[str, Any] | None = None
    """The dataset factory's keyword arguments (`{}` for none)."""
    loss: str | None = None
    """The loss spec (`cross_entropy` in records that lack it)."""
    model_facts: ModelFacts | None = None
    """What the launcher and rank 0 built (ModelFacts); null when unknown."""
    global_batch: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Samples per optimizer step over all replicas: `micro_batch` × `world_size` × K
    (`--grad-accum-steps K`); a script run: the most common samples per step summed over
    ranks."""
    per_device_batch: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Samples per device per optimizer step (`micro_batch` × K); a script run: rank 0's most
    common."""
    grad_accum_steps: Positive | None = None
    """Micro-batches per optimizer step (one all-reduce each step); a script run: the most
    common forwards per step. Absent in older folders: read as 1."""
    micro_batch: Positive | None = None
    """Samples per device per forward. Absent in older folders: read as `per_device_batch`."""
    scaling: Literal["strong", "weak"] | None = None
    """strong keeps `global_batch` fixed across modes, weak keeps `per_device_batch`."""
    amp: str | None = None
    """none, bf16 or fp16."""
    seed: int | None = None
    """`--seed`."""
    epochs: Count | None = None
    """`--epochs`."""
    max_steps: Count | None = None
    """`--max-steps` (a script run: null without it)."""
    lr: float | None = None
    """`--lr`."""
    momentum: float | None = None
    """`--momentum`."""
    weight_decay: float | None = None
    """`--weight-decay`."""
    sync_bn: bool | None = None
    """`--sync-bn`."""
    num_workers: Count | None = None
    """DataLoader workers per rank."""
    pin_memory: bool | None = None
    """`--pin-memory`."""
    warmup_steps: Count | None = None
    """Steps kept out of throughput at the start (steps.csv `warmup` = 1)."""
    eval_batches: Count | None = None  # --eval-batches (0 = the whole test split); newer runs
    """`--eval-batches`: the cap of each epoch's evaluation in batches of 256 test samples,
    0 = the whole test split (newer runs)."""
    rendezvous: str | None = None
    """c10d or file."""
    ddp: DdpConfig | None = None
    """The DDP settings (DdpConfig)."""
    # ZeRO stage of a DDP run's optimizer (1: ZeroRedundancyOptimizer); absent before it existed.
    zero: Annotated[int, msgspec.Meta(ge=0, le=1)] | None = None
    """`--zero`: 1 when a DDP run's optimizer is ZeroRedundancyOptimizer (ZeRO-1; a script run:
    one it saw), else 0; absent in older runs."""
    fsdp: FsdpConfig | None = None
    """How an fsdp run sharded the model (FsdpConfig); null in other modes."""
    profile: ProfileSettings | None = None
    """The profiler settings (ProfileSettings)."""
    sweep_id: str | None = None
    """The `make profile-sweep` run this run belongs to, or null (older folders lack it)."""
    # `--repeat` rounds: the set of rounds (one id) and this run's round in it, from 0
    repeat_id: str | None = None
    """`--repeat`: the id of the set of rounds this run is one of (null outside rounds)."""
    repeat_round: Count | None = None
    """`--repeat`: this run's round in that set, from 0 (null outside rounds)."""
    # A `--script` / RunRecorder run: what it ran (the same-workload key, docs/reference/metrics.md).
    workload: str | None = None
    """A script or RunRecorder run's same-workload key: `script:<sha256[:16]> ARGS...` or
    `--workload NAME`."""
    script: str | None = None
    """`--script`: the script's absolute path."""
    script_args: list[str] | None = None
    """`--script`: its arguments."""
    script_sha256: str | None = None
    """`--script`: the sha256 of the script file."""


# -- run.json: env ------------------------------------------------------------------------------


class HostLoad(Schema, kw_only=True):
    """env.host_load: how busy the machine (rank 0's host) was while the run measured its steps,
    from the start of the first non-warm-up step to the end (profiler/runfolder/hostload.py);
    null when every step was a warm-up step."""

    load_avg_1m_start: Annotated[float, msgspec.Meta(ge=0)] | None = None
    """1-minute load average when the first measured step starts."""
    load_avg_1m_end: Annotated[float, msgspec.Meta(ge=0)] | None = None
    """1-minute load average after the last step."""
    # cores' worth of CPU used by other processes during the measured steps
    other_cpu_cores_mean: Annotated[float, msgspec.Meta(ge=0)] | None = None
    """Cores' worth of CPU used by processes other than the run's own: (Δ busy CPU s of the
    machine − Δ CPU s of the run's processes) ÷ Δ wall s, ≥ 0 (busy = user + nice + system +
    irq + softirq; the run's processes: rank 0 and its children, under torchrun the agent and
    every rank). The report flags a run where it is > 0.5 × `cores`."""
    steal_pct: Pct | None = None
    """Δ steal ÷ Δ total CPU × 100, %; null where the OS reports no steal."""
    cores: Count | None = None
    """Logical cores."""
    own_threads: Count | None = None
    """Threads of the run's processes at the end."""


class Env(Schema, kw_only=True):
    """run.json `env`: software versions and the machine."""

    os: str | None = None
    """`platform.system()`."""
    platform: str | None = None
    """`platform.platform()`."""
    python: str | None = None
    """Python version."""
    torch: str | None = None
    """torch version."""
    cuda: str | None = None
    """CUDA version; null on CPU builds and machines without CUDA."""
    nccl: str | None = None
    """NCCL version; null if unavailable."""
    gpus: list[str] = []
    """GPU names."""
    cpu_model: str | None = None
    """The CPU's model name."""
    cpu_cores: Count | None = None
    """Logical cores."""
    threads_per_rank: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """torch threads per rank (null on a skipped run)."""
    # Total memory of one device (the first GPU, or the host's RAM for CPU runs), bytes.
    device_memory_bytes: Bytes | None = None
    """Total memory of one device: the first GPU's for a CUDA run, the host's RAM for a CPU run,
    bytes (the per-rank memory budget's default; null on a skipped run; newer runs)."""
    hostname: str | None = None
    """The host's name."""
    host_load: HostLoad | None = None
    """How busy the machine was (HostLoad; newer runs)."""


# -- run.json: metrics --------------------------------------------------------------------------


class StepTime(Schema, kw_only=True):
    """`metrics.step_time_s`: over the throughput steps of all ranks, s."""

    mean: Seconds | None = None
    """Mean, s."""
    p50: Seconds | None = None
    """Median, s."""
    p95: Seconds | None = None
    """95th percentile, s."""


class PerRank(Schema, kw_only=True):
    """A `metrics.per_rank[]` entry: one rank over its throughput steps."""

    rank: Count
    """The rank."""
    steps: Count | None = None
    """Its throughput steps."""
    samples_per_s: Rate | None = None
    """Its samples ÷ its summed step time, samples/s."""
    step_time_s_mean: Seconds | None = None
    """Mean step time, s."""
    step_time_s_p50: Seconds | None = None
    """Median step time, s."""
    step_time_s_p95: Seconds | None = None
    """95th percentile step time, s."""


class MemoryEntry(Schema, kw_only=True):
    """A `metrics.memory[]` (and `memory_after_first_step[]`) entry: one rank and device
    (DP: one per GPU it touches). CUDA fields are null on CPU."""

    rank: Count | None = None
    """The rank."""
    device: str | None = None
    """The device."""
    peak_allocated_bytes: Count | None = None
    """`torch.cuda.max_memory_allocated` of that device, bytes."""
    peak_reserved_bytes: Count | None = None
    """`torch.cuda.max_memory_reserved`, bytes."""
    nvml_used_bytes: Count | None = None
    """The highest device-wide used memory NVML reported while sampling (all processes), bytes."""
    peak_rss_bytes: Count | None = None
    """The highest sampled RSS of the rank's process (the same in each of its entries), bytes."""


class BreakdownEntry(Schema, kw_only=True):
    """A `metrics.memory_breakdown[]` entry: static memory of one rank and device, counted
    exactly from the tensors, each storage once (definitions: metrics.md §11)."""

    rank: int | None = None
    """The rank."""
    device: str | None = None
    """The device (DP: one entry per GPU; the module lives on the first)."""
    parameters_bytes: int | None = None
    """Parameters, bytes."""
    gradients_bytes: int | None = None
    """`.grad` tensors, bytes."""
    optimizer_state_bytes: int | None = None
    """The optimizer's state, bytes."""
    buffers_bytes: int | None = None
    """Module buffers, bytes."""
    ddp_buckets_bytes: int | None = None
    """DDP's gradient buckets that `.grad` does not share (≈ gradients by default, 0 with
    `--gradient-as-bucket-view`), bytes."""
    static_total_bytes: int | None = None
    """The sum of the above, bytes."""
    fsdp_unsharded_peak_bytes: int | None = None
    """FSDP2: the most bytes of gathered (unsharded) parameters alive at once during the counted
    step, bytes, not part of `static_total_bytes`; null outside FSDP2 (newer runs)."""
    counted_at_step: int | None = None
    """The step it was counted on: the second optimizer step the process runs (the first when
    it runs one)."""


class DdpMetrics(Schema, kw_only=True):
    """run.json `metrics.ddp` (null outside DDP): the reducer's bucket layout."""

    num_buckets: Count | None = None
    """Gradient buckets."""
    bucket_sizes_bytes: Annotated[list[Bytes], msgspec.Meta(max_length=1_000_000)] = []
    """Each bucket's size, bytes."""
    grad_bytes_total: Bytes | None = None
    """Gradient bytes of all trainable parameters."""
    param_count: Count | None = None
    """Trainable parameters."""


class FsdpGroup(Schema, kw_only=True):
    """A `metrics.fsdp.groups[]` entry: the parameters one fully_shard call owns (one all-gather
    in forward, one reduce-scatter in backward)."""

    module: str
    """The module's qualified name (`""` = the root)."""
    params: Count = 0
    """Parameter tensors."""
    numel: Count = 0
    """Elements, unpadded (the model's own)."""
    unsharded_bytes: Bytes = 0
    """World size × padded shard: the all-gather's output, bytes."""
    shard_bytes: Bytes = 0
    """One rank's padded shard (what each rank keeps), bytes."""


class FsdpMetrics(Schema, kw_only=True):
    """run.json `metrics.fsdp` (fsdp runs, else null): the sharding as fully_shard made it."""

    world_size: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """The ranks the parameters are sharded over."""
    groups: Annotated[list[FsdpGroup], msgspec.Meta(max_length=1_000_000)] = []
    """One per fully_shard call, the root last (FsdpGroup)."""


class ProfileExport(Schema, kw_only=True):
    """A `metrics.profile[]` entry: seconds one rank's profiler spent exporting traces."""

    rank: Count
    """The rank."""
    export_s: Seconds | None = None
    """`export_chrome_trace` at the end of each active window and of the cycle cut short at the
    run's end, s. The export at a window's end is inside the step it delays (its
    `profiler_s`); the one at the run's end falls in no step."""


class Metrics(Schema, kw_only=True):
    """run.json `metrics` (`{}` on a skipped or running run). The throughput steps: the
    measured steps the profiler did not trace ("The throughput steps")."""

    samples_per_s: Rate | None = None
    """Samples of all ranks in the throughput steps ÷ the longest per-rank sum of those steps'
    `step_time_s`, samples/s."""
    step_time_s: StepTime | None = None
    """`{mean, p50, p95}` over the throughput steps of all ranks (StepTime), s."""
    per_rank: Annotated[list[PerRank], msgspec.Meta(max_length=MAX_ENTRIES)] = []
    """Per rank over its throughput steps (PerRank)."""
    # schema 2: (profiled ÷ unprofiled mean step time − 1) × 100 ≥ −100; may be negative (noise)
    profiler_overhead_pct: Annotated[float, msgspec.Meta(ge=-100, le=FINITE_MAX)] | None = None
    """(mean own time of the profiler's active steps ÷ mean `step_time_s` of the unprofiled
    measured steps − 1) × 100, %, each mean on the slowest rank; a traced step's own time is its
    `step_time_s` − `profiler_s`. Null with `--no-profile` or without both kinds of step; below
    zero it is noise, never a cost."""
    # Newer runs: two standard errors of that overhead (%), and each rank's trace export time.
    profiler_overhead_noise_pct: Seconds | None = None
    """Two standard errors of that difference, % of the unprofiled mean: 200 × √(s_t²/k +
    s_c²/m) ÷ mean_c (k traced and m unprofiled steps); null with fewer than two unprofiled
    steps. An overhead at or below it cannot be told from noise (newer runs)."""
    epoch_time_s: list[Seconds] = []
    """Wall time of each training epoch on rank 0 (eval excluded), s."""
    wall_time_s: Seconds | None = None
    """Rank 0's wall time from the start of training to the end of the run, s."""
    memory: Annotated[list[MemoryEntry], msgspec.Meta(max_length=MAX_ENTRIES)] = []
    """Steady-state peaks per rank and device (MemoryEntry): from right after the first
    optimizer step (where the peaks are reset) to the end of the run."""
    memory_after_first_step: Annotated[list[MemoryEntry], msgspec.Meta(max_length=MAX_ENTRIES)] = []
    """The same shape, peaks from the start of training to right after the first optimizer
    step."""
    memory_breakdown: Annotated[list[BreakdownEntry], msgspec.Meta(max_length=MAX_ENTRIES)] = []
    """Static memory per rank and device (BreakdownEntry; absent in older folders); no entry for
    a rank that never reached its counted step."""
    ddp: DdpMetrics | None = None
    """DDP's bucket layout (DdpMetrics), null outside DDP."""
    fsdp: FsdpMetrics | None = None
    """FSDP2's parameter groups (FsdpMetrics), null outside FSDP2 (newer runs)."""
    param_grad_bytes: Annotated[list[Bytes], msgspec.Meta(max_length=10_000_000)] | None = None
    """Gradient bytes of each trainable parameter in `model.parameters()` order, every mode;
    `analysis project` builds a single-device run's DDP buckets from it (newer runs)."""
    buffer_bytes_by_dtype: dict[str, Bytes] | None = None
    """Bytes of the model's buffers per dtype (`{"float32": 1792}`; `{}` without buffers),
    what DDP broadcasts at every forward (newer runs)."""
    profile: Annotated[list[ProfileExport], msgspec.Meta(max_length=MAX_ENTRIES)] = []
    """Per rank, the seconds its profiler spent exporting traces (ProfileExport; newer
    `--script` runs)."""


# -- run.json: eval and the rest ----------------------------------------------------------------


class EvalEntry(Schema, kw_only=True):
    """An `eval.epochs[]` entry (and `eval.best`): one epoch's evaluation, with what the output
    allows (`output`, workloads.train.losses)."""

    epoch: Count | None = None
    """The epoch."""
    output: Literal["class_scores", "sequence", "other"] | None = None
    """What the eval could score: class_scores (output (N, C)), sequence (output (N, T, C)),
    other (e.g. regression: `test_loss` only)."""
    # Finite; negative only from a user's --loss (a log-likelihood may be below 0).
    test_loss: Annotated[float, msgspec.Meta(ge=-FINITE_MAX, le=FINITE_MAX)] | None = None
    """The mean `--loss` per sample (per token for sequences), each batch weighted by its
    samples."""
    top1_pct: Pct | None = None
    """Samples (tokens) whose label is the top prediction, %."""
    top5_pct: Pct | None = None
    """Samples whose label is among the top 5, % (null for sequences)."""
    # Sequence outputs: exp(mean token cross-entropy) and the tokens scored.
    perplexity: Annotated[float, msgspec.Meta(ge=1, le=FINITE_MAX)] | None = None
    """Sequences: exp(mean token cross-entropy of the logits)."""
    samples: Count | None = None
    """Samples evaluated: the first min(`split_samples`, `eval_batches` × 256)."""
    tokens: Count | None = None
    """Sequences: N·T summed."""


class Eval(Schema, kw_only=True):
    """run.json `eval`: the evaluation after every training epoch, the same samples in every
    mode (DDP ranks each evaluate a shard and all-reduce the sums). Empty for a script run."""

    epochs: list[EvalEntry] = []
    """One per epoch (EvalEntry)."""
    best: EvalEntry | None = None
    """The epoch with the highest `top1_pct` (the lowest `test_loss` without one), or null."""
    note: str | None = None  # why the run has no eval (a dataset without a test split)
    """Why there is no eval (`--dataset X has no test split`), else null."""
    split_samples: Count | None = None  # the test split's size (newer runs; --eval-batches caps)
    """The test split's size (newer runs)."""


class LeftOut(Schema, kw_only=True):
    """A `traces_left_out[]` entry: a trace on disk that is not part of the run, and why."""

    file: PathText
    """The trace, relative to the run folder."""
    reason: str = ""
    """Why it is left out."""


class Resume(Schema, kw_only=True):
    """A `resumes[]` entry: one restarted attempt."""

    attempt: int
    """The attempt (1 = the first restart)."""
    resumed_from_step: int | None = None
    """The step it resumed from (0 when no checkpoint existed)."""


class RunRecord(Schema, kw_only=True):
    """run.json of a training, `--script` or RunRecorder run: the run record."""

    schema_version: int
    """The run-folder schema version (see "What changed in 2"; analysis still reads 1)."""
    run_id: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    """The folder name."""
    status: Status
    """running (the launcher wrote it, the run has not finished), ok, failed, skipped, or
    interrupted (a `--script` run stopped by SIGINT or SIGTERM: it keeps what its ranks recorded,
    and analysis uses it like an ok run)."""
    error: ErrorInfo | None = None
    """Why it failed, was skipped or interrupted (ErrorInfo), else null."""
    created_at: str | None = None
    """When the launcher started it, ISO-8601 UTC."""
    finished_at: str | None = None
    """When it ended, ISO-8601 UTC; null while running."""
    config: Config
    """What was asked for and the layout (Config)."""
    env: Env = msgspec.field(default_factory=Env)
    """Software and machine (Env)."""
    metrics: Metrics = msgspec.field(default_factory=Metrics)
    """What was measured (Metrics)."""
    eval: Eval = msgspec.field(default_factory=Eval)
    """The evaluations (Eval)."""
    traces: list[PathText] = []
    """Trace paths relative to the run folder: every trace the run's ranks wrote, also those of
    a rank stopped by a signal and, in a `--script` run, those on disk of a rank killed before
    it wrote its part."""
    # Newer script runs: traces on disk that the record leaves out, each with its reason.
    traces_left_out: Annotated[list[LeftOut], msgspec.Meta(max_length=MAX_ENTRIES)] = []
    """Traces on disk that are not part of the run (LeftOut), e.g. those of a `--mode ddp`
    script's processes that never joined a process group (newer `--script` runs)."""
    warnings: list[str] = []  # schema 2: the writer's own warnings (e.g. no unprofiled step)
    """What a reader of the numbers must know (absent in schema 1 and while running)."""
    stop_reason: str | None = None  # newer script runs: "stopped after --max-steps N"
    """Why a run ended early but ok: `stopped after --max-steps N` (a `--script` run)."""
    restarts: Count | None = None
    """Times torchrun restarted the job (`--max-restarts`); absent from an ok run never
    restarted, always present in a failed one."""
    resumes: list[Resume] | None = None
    """Per restart, where it resumed (Resume); present with `restarts`."""


# -- steps.csv and the part files ---------------------------------------------------------------


class StepRow(Schema, kw_only=True):
    """One steps.csv row: one rank's optimizer step. The fields are the columns, in order;
    `profiled` (schema 2) and `profiler_s` are optional for readers."""

    rank: Count
    """The rank."""
    epoch: Count | None = None
    """The epoch (0-based)."""
    step: Count
    """The global optimizer step from 0."""
    warmup: Flag
    """1 for the first `warmup_steps` steps (kept out of throughput), else 0."""
    profiled: Flag | None = None
    """1 for the steps torch.profiler traced (its warm-up and active steps), else 0."""
    step_time_s: Seconds
    """The step's wall time, s; `profiler_s` included."""
    data_s: Seconds
    """Fetching the batch and moving it to the device, s."""
    forward_s: Seconds
    """The forward (summed over micro-batches), s."""
    backward_s: Seconds
    """The backward (summed over micro-batches; DDP's all-reduce overlaps it), s."""
    optimizer_s: Seconds
    """The optimizer step, s."""
    # Newer runs: the profiler's own seconds at the step's end, inside step_time_s.
    profiler_s: Seconds | None = None
    """The profiler's own work at the step's end (start, stop, export of its trace), inside
    `step_time_s` and in no phase, s (read a missing one as 0)."""
    samples: Count | None = None
    """Samples this rank processed in the step (DP: the global batch)."""
    loss: float | None = None
    """The mean training loss over the rank's samples of the step."""
    rss_bytes: Count | None = None
    """The rank process's resident set size at the step's end, bytes."""
    cuda_allocated_bytes: Count | None = None
    """`torch.cuda.memory_allocated` on the rank's first GPU at the step's end, bytes (empty on
    CPU)."""
    # cores' worth of CPU other processes used during the step (rank 0's rows; newer runs)
    other_cpu_cores: Annotated[float, msgspec.Meta(ge=0, le=FINITE_MAX)] | None = None
    """Cores' worth of CPU that processes other than the run's own used during the step, as
    env.host_load's `other_cpu_cores_mean` over one step (rank 0's rows; empty on other ranks
    and in older runs)."""


# The columns every steps.csv must have (StepRow's required fields); the others may be empty.
REQUIRED_STEP_COLUMNS = tuple(f.name for f in msgspec.structs.fields(StepRow) if f.required)


class TraceExport(Schema, kw_only=True):
    """A part's `profile_exports[]` entry: one profiler call that wrote a trace."""

    step: int | None = None
    """The step it happened in; null at the run's end (in no step)."""
    export_s: Seconds
    """Its seconds, s."""


class RankPart(Schema, kw_only=True):
    """`logs/rank<r>.part.json`: what one rank of a `--script` or RunRecorder run recorded,
    written at its exit and assembled into steps.csv and run.json (profiler/runfolder/parts.py)."""

    rank: Count
    """The rank."""
    world_size: Positive
    """The world size it saw (DP: its devices)."""
    env_world_size: Positive = 1
    """`WORLD_SIZE` of its environment (what was launched)."""
    mode: Mode
    """The mode it detected (fsdp: fully_shard seen on the model)."""
    backend: str
    """Its process group's backend, or none."""
    pg_seen: bool
    """Whether it ever saw an initialized process group."""
    devices: list[str]
    """Where it computed."""
    model: str | None = None
    """The trained module's class."""
    param_count: Count | None = None
    """Its parameters."""
    workload: str | None = None
    """The same-workload key (`--workload`, RunRecorder(workload=...))."""
    rows: list[StepRow] = []
    """Its steps.csv rows."""
    micro_batches: list[Count] = []
    """Forwards per step."""
    active_steps: list[Count] = []
    """The steps its profiler recorded."""
    memory: list[MemoryEntry] = []
    """Its `metrics.memory` entries."""
    memory_after_first_step: list[MemoryEntry] = []
    """Its `metrics.memory_after_first_step` entries."""
    memory_breakdown: list[BreakdownEntry] = []
    """Its `metrics.memory_breakdown` entries."""
    traces: list[PathText] = []
    """Its traces, relative to the run folder."""
    warnings: list[str] = []
    """Its warnings (e.g. the script ran its own profiler)."""
    zero: Annotated[int, msgspec.Meta(ge=0, le=1)] | None = None
    """1 when its optimizer was a ZeroRedundancyOptimizer, else 0 (`config.zero`)."""
    fsdp_config: FsdpConfig | None = None
    """fully_shard seen on its model: `{wrap: "seen", reshard_after_forward}` (`config.fsdp`)."""
    wall_time_s: Seconds | None = None
    """Seconds from the recorder's creation to its end, s."""
    env: Env = msgspec.field(default_factory=Env)
    """Its env (with host_load on rank 0)."""
    ddp: DdpMetrics | None = None
    """DDP's bucket layout, with a model given."""
    fsdp: FsdpMetrics | None = None
    """FSDP2's parameter groups, with a model given (`metrics.fsdp`)."""
    param_grad_bytes: list[Bytes] = []
    """As `metrics.param_grad_bytes`, with a model given."""
    buffer_bytes_by_dtype: dict[str, Bytes] = {}
    """As `metrics.buffer_bytes_by_dtype`, with a model given."""
    profile_exports: list[TraceExport] | None = None
    """`--script`: each profiler call that wrote a trace."""
    ended: Literal["ok", "max_steps", "failed", "signal"] | None = None
    """`--script`: how the script ended."""
    exit_code: int | None = None
    """`--script`: the rank's exit code."""
    stop_reason: str | None = None
    """`--script` stopped by `--max-steps`: the record's `stop_reason`."""
    signal: str | None = None
    """`--script` ended by a signal: its name."""
    signal_time: float | None = None
    """When that signal arrived (Unix seconds)."""


# -- run.json of a comm run ---------------------------------------------------------------------


class CommConfig(Schema, kw_only=True):
    """A comm run's `config`."""

    backend: str | None = None
    """nccl or gloo."""
    world_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_RANKS)] | None = None
    """Ranks."""
    nproc_per_node: Positive | None = None
    """Processes per node."""
    devices: list[str] | None = []
    """One per rank."""
    sizes_bytes: list[Count] | None = None
    """The message sizes timed, bytes."""
    iters: Positive | None = None
    """Timed calls per size."""
    warmup: Count | None = None
    """Untimed calls before them."""
    dtype: str | None = None
    """The tensors' dtype."""
    collectives: list[str] | None = None
    """The collectives asked for (newer runs)."""
    gaps_ms: list[Annotated[float, msgspec.Meta(ge=0)]] | None = None
    """The idle-penalty sweep's gaps: ms of compute before a timed call (newer runs)."""
    gap_iters: Positive | None = None
    """Calls per gap and size in that sweep (newer runs)."""
    gap_ms: dict[str, Annotated[float, msgspec.Meta(ge=0, le=FINITE_MAX)]] | None = None
    """Runs before the sweep: `{collective: ms of compute before each timed call}`."""


class CommFit(Schema, kw_only=True):
    """A `metrics.comm_model` value: the α–β fit of one collective (metrics.md §10)."""

    collective: str | None = None
    """The collective."""
    world_size: int | None = None
    """Ranks."""
    alpha_us: float | None = None
    """Latency per ring step α, µs."""
    bus_gbps: float | None = None
    """Bus bandwidth B, GB/s."""
    steps: int | None = None
    """Ring latency steps."""
    bus_factor: float | None = None
    """nccl-tests' bus factor."""
    fit_error_pct_mean: float | None = None
    """Mean |fit − measured| ÷ measured, %."""
    fit_error_pct_max: float | None = None
    """Its maximum, %."""
    bytes_min: int | None = None
    """The smallest size fitted, bytes."""
    bytes_max: int | None = None
    """The largest, bytes."""
    points: int | None = None
    """Sizes fitted."""


class SkippedCollective(Schema, kw_only=True):
    """A comm run's `metrics.skipped[]` entry."""

    collective: str | None = None
    """The collective."""
    reason: str | None = None
    """Why it was not timed."""


class CommMean(Schema, kw_only=True):
    """A comm run's `metrics.time_us_mean[]` entry, one per comm.csv row."""

    collective: str
    """The collective."""
    bytes: Count
    """Message size, bytes."""
    time_us_mean: Seconds | None = None
    """Mean time of the timed calls, µs."""
    time_us_mean_back_to_back: Seconds | None = None
    """Runs before the sweep, with a gap: the same call right after another, µs."""
    time_us_mean_last_arrival: Seconds | None = None
    """Mean time of the last-arriving rank, µs (newer runs)."""
    time_us_p5_last_arrival: Seconds | None = None
    """Its 5th percentile, µs."""
    time_us_p95_last_arrival: Seconds | None = None
    """Its 95th percentile, µs."""


class IdlePenalty(Schema, kw_only=True):
    """A comm run's `metrics.idle_penalty[]` entry: a call after `gap_ms` of compute and the same
    call right after it."""

    collective: str | None = None
    """The collective."""
    bytes: int | None = None
    """Message size, bytes."""
    gap_ms: float | None = None
    """Compute before the call, ms."""
    time_us_mean: float | None = None
    """The call after the gap, µs."""
    time_us_mean_back_to_back: float | None = None
    """The same call right after it, µs."""
    time_us_mean_last_arrival: float | None = None
    """The call after the gap, on the last-arriving rank, µs (newer runs)."""


class Contention(Schema, kw_only=True):
    """A comm run's `metrics.host_contention`: how ranks busy at once slow each other's compute
    (CPU); on GPU only `note`."""

    device: str | None = None
    """cpu or cuda."""
    ranks: list[int] = []
    """Ranks busy at once."""
    slowdown: list[float] = []
    """`slowdown[i]`: the compute slowdown with `ranks[i]` ranks busy (the median over the rounds;
    newer runs: of each round's ratio to its own time alone)."""
    slowdown_min: list[float] | None = None
    """Its minimum over the rounds."""
    slowdown_max: list[float] | None = None
    """Its maximum over the rounds."""
    time_ms_alone: float | None = None
    """The kernel's time on one rank alone, ms."""
    kernel: str | None = None
    """What the kernel computes."""
    threads_per_rank: int | None = None
    """torch threads per rank."""
    windows: int | None = None
    """How many windows of rounds, spread over the comm run, were measured (newer runs: 3)."""
    note: str | None = None
    """GPU: why it was not measured."""


class CommMetrics(Schema, kw_only=True):
    """A comm run's `metrics` (`{}` while running; medians are in comm.csv)."""

    comm_model: dict[str, CommFit] | None = None
    """Per collective, its α–β fit (CommFit)."""
    checks: dict[str, str] | None = None
    """Per collective: ok or wrong result."""
    skipped: list[SkippedCollective] = []
    """The collectives not timed, with the reason."""
    time_us_mean: Annotated[list[CommMean], msgspec.Meta(max_length=100_000)] = []
    """Mean times per collective and size (CommMean; newer runs)."""
    idle_penalty: list[IdlePenalty] | None = None
    """The idle-penalty sweep (IdlePenalty; newer runs)."""
    idle_sweep_s: float | None = None
    """The sweep's measured time, s."""
    host_contention: Contention | None = None
    """How ranks busy at once slow each other (Contention)."""


class CommRunRecord(Schema, kw_only=True):
    """run.json of a `make bench-comm` run folder (`kind: "comm"`, metrics.md §10): the comm
    run's record."""

    schema_version: int | None = None  # hand-made comm folders may lack it: read as current
    """The run-folder schema version (hand-made folders may lack it: read as current)."""
    kind: Literal["comm"]
    """Always `comm`."""
    run_id: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    """The folder name."""
    status: Status
    """running, ok or failed."""
    error: ErrorInfo | None = None
    """Why it failed (`message`, `rank`, `exit_code`, `log_tail`), else null."""
    created_at: str | None = None
    """ISO-8601 UTC."""
    finished_at: str | None = None
    """ISO-8601 UTC; null while running."""
    config: CommConfig = msgspec.field(default_factory=CommConfig)
    """What was timed (CommConfig)."""
    env: Env = msgspec.field(default_factory=Env)  # newer runs: env.host_load during the timing
    """As for training runs; `host_load` over the whole timing, rank 0."""
    metrics: CommMetrics = msgspec.field(default_factory=CommMetrics)
    """What was measured (CommMetrics)."""
