"""run.json, steps.csv and a comm run's run.json validated at the boundary, once: typed msgspec
Structs with ranges, for every reader (analysis, the launcher, the tools).

Everything after `read_record` / `read_comm_record` (and profiler.steps' `read_steps_frame`)
may trust types and ranges: counts ≥ 0, world size ≥ 1, finite non-negative times, known
statuses and schema versions. A file that breaks a rule raises `InvalidRecord`, one line naming
the file, the field and what is wrong; analysis then lists the run as `invalid` and never analyses
it. Unknown fields are ignored (newer writers add optional fields), and every field that older
writers may lack is optional. The rules are listed in docs/reference/run-folder.md; the names of
the files and columns are profiler.runfolder's.

Torch-free and below both halves (analysis imports it; it imports neither workloads nor analysis).
The one bad-input error type, `InputError` (analysis.errors.InputError), is profiler.inputfile's
and re-exported here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import msgspec

from profiler.inputfile import BadJSON, InputError, decode_json, read_regular
from profiler.recordtypes import (
    _FINITE_MAX,
    MAX_ENTRIES,
    MAX_RANKS,
    Bytes,
    Count,
    DdpConfig,
    DdpMetrics,
    ErrorInfo,
    Flag,
    HostLoad,
    ModelFacts,
    PathText,
    Pct,
    ProfileConfig,
    Rate,
    Seconds,
)
from profiler.runfolder import READABLE_RUN_FOLDER_SCHEMAS

__all__ = [
    "REQUIRED_STEP_COLUMNS",
    "STATUSES",
    "CommRecord",
    "HostLoad",
    "InputError",
    "InvalidRecord",
    "RunRecord",
    "StepRow",
    "read_comm_record",
    "read_record",
    "record_kind",
]

Status = Literal["running", "ok", "failed", "skipped", "interrupted"]
STATUSES = get_args(Status)


class Config(msgspec.Struct):
    mode: Literal["single", "dp", "ddp"]
    # Null only on a skipped run whose layout could not be decided (checked in read_record).
    world_size: Annotated[int, msgspec.Meta(ge=1)] | None
    backend: str | None = None
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
    profile: ProfileConfig | None = None
    global_batch: Annotated[int, msgspec.Meta(ge=1)] | None = None
    per_device_batch: Annotated[int, msgspec.Meta(ge=1)] | None = None
    scaling: Literal["strong", "weak"] | None = None
    amp: str | None = None
    seed: int | None = None
    warmup_steps: Count | None = None
    sweep_id: str | None = None
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
    param_grad_bytes: Annotated[list[Bytes], msgspec.Meta(max_length=10_000_000)] | None = None
    buffer_bytes_by_dtype: dict[str, Bytes] | None = None
    # schema 2: (profiled ÷ unprofiled mean step time − 1) × 100 ≥ −100; may be negative (noise)
    profiler_overhead_pct: Annotated[float, msgspec.Meta(ge=-100, le=_FINITE_MAX)] | None = None
    # Newer runs: two standard errors of that overhead (%), and each rank's trace export time.
    profiler_overhead_noise_pct: Seconds | None = None
    profile: Annotated[list[ProfileExport], msgspec.Meta(max_length=MAX_ENTRIES)] = []


class EvalEntry(msgspec.Struct):
    epoch: Count | None = None
    # Finite; negative only from a user's --loss (a log-likelihood may be below 0).
    test_loss: Annotated[float, msgspec.Meta(ge=-_FINITE_MAX, le=_FINITE_MAX)] | None = None
    top1_pct: Pct | None = None
    top5_pct: Pct | None = None
    samples: Count | None = None
    # Sequence outputs: exp(mean token cross-entropy) and the tokens scored; `output` is what
    # the eval could score (class_scores | sequence | other).
    perplexity: Annotated[float, msgspec.Meta(ge=1, le=_FINITE_MAX)] | None = None
    tokens: Count | None = None
    output: Literal["class_scores", "sequence", "other"] | None = None


class Eval(msgspec.Struct):
    epochs: list[EvalEntry] = []
    best: EvalEntry | None = None
    note: str | None = None  # why the run has no eval (a dataset without a test split)


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
    """One steps.csv row; `profiled` (schema_version 2) and `profiler_s` are optional."""

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


# The columns every steps.csv must have (StepRow's required fields); the others may be empty.
REQUIRED_STEP_COLUMNS = StepRow.__struct_fields__[: -len(StepRow.__struct_defaults__)]


class CommConfig(msgspec.Struct):
    backend: str | None = None
    world_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_RANKS)] | None = None
    devices: list[str] | None = []
    gap_ms: dict[str, Annotated[float, msgspec.Meta(ge=0, le=_FINITE_MAX)]] | None = None


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


class InvalidRecord(InputError):
    """A run.json or steps.csv that breaks the run-folder contract; `field` names the field."""

    def __init__(
        self,
        path: Path,
        field: str,
        problem: str,
        fix: str = "fix or remove this run folder (re-run it to get a valid record)",
    ) -> None:
        # msgspec quotes bad enum values: a 2 MB `status` must not become a 2 MB line.
        problem = " ".join(problem.split())
        problem = problem if len(problem) <= 300 else problem[:299] + "…"
        self.file, self.field, self.problem = str(path), field, problem
        super().__init__(
            path, f"invalid `{field}`: {problem}" if field else f"invalid: {problem}", fix
        )

    def to_dict(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in ("file", "field", "problem")} | {"reason": str(self)}


_AT_RE = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<at>[^`]*)`)?$", re.DOTALL)


def _explain(err: msgspec.ValidationError) -> tuple[str, str]:
    """(field path such as `config.world_size`, problem) from a msgspec error message."""
    m = _AT_RE.match(str(err))
    msg, at = (m["msg"], m["at"] or "") if m else (str(err), "")
    msg = msg.replace(f"`float` <= {_FINITE_MAX!r}", "a finite `float`")
    return at.lstrip("."), msg


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _decode_json(path: Path) -> dict:
    """The JSON object in `path` (profiler.inputfile's reading rules: a regular file under the
    size limit, BOM and lone surrogates accepted); InputError when missing, unreadable or not
    JSON, InvalidRecord when nested too deeply, with a duplicate key or not an object."""
    interrupted = "the run was interrupted while writing; re-run it"
    try:
        raw = decode_json(path, "run.json", "fix or remove this run folder")
    except BadJSON as err:
        if err.reason == "malformed":
            raise InputError(
                path, err.what.replace("not JSON", "unreadable"), interrupted
            ) from None
        if err.reason == "deep":
            raise InvalidRecord(path, "", "nested too deeply to be a run record") from None
        raise InvalidRecord(path, err.field, err.what) from None
    except InputError as err:
        if err.what == "missing":
            raise InputError(path, "missing", "not a run folder") from None
        raise InvalidRecord(path, "", err.what, err.fix) from None
    if not isinstance(raw, dict):
        raise InvalidRecord(path, "", f"expected an object, got {type(raw).__name__}")
    return raw


def _convert(path: Path, raw: dict, kind: type[msgspec.Struct]) -> Any:
    try:
        rec = msgspec.convert(raw, kind)
    except msgspec.ValidationError as err:
        field, problem = _explain(err)
        raise InvalidRecord(path, field, problem) from None
    if rec.schema_version is not None and rec.schema_version not in READABLE_RUN_FOLDER_SCHEMAS:
        known = ", ".join(map(str, READABLE_RUN_FOLDER_SCHEMAS))
        raise InvalidRecord(
            path,
            "schema_version",
            f"unknown version {rec.schema_version} (this dpscope reads {known})",
            "analyse it with the dpscope version that wrote it",
        )
    return rec


def read_record(path: Path) -> tuple[RunRecord, dict]:
    """Decode and validate a training run's run.json: (typed record, the raw object for verbatim
    copies and for writers that update it).

    Raises InputError when the file is missing or not JSON, InvalidRecord when it breaks a rule.
    """
    raw = _decode_json(path)
    rec = _convert(path, raw, RunRecord)
    if rec.status != "skipped":  # a run that started knows its layout
        for name in ("world_size", "devices"):
            if getattr(rec.config, name) is None:
                raise InvalidRecord(path, f"config.{name}", f"null on a {rec.status} run")
    return rec, raw


class _Kind(msgspec.Struct):
    kind: Any = None


def record_kind(path: Path) -> str | None:
    """run.json's `kind` (`comm` for a `make bench-comm` folder; absent, i.e. None, for a
    training run), or None when the file is missing or no JSON object: which reader applies."""
    try:
        kind = msgspec.json.decode(read_regular(path, "run.json"), type=_Kind).kind
    except (InputError, RecursionError, msgspec.DecodeError):
        return None
    return kind if isinstance(kind, str) else None


def read_comm_record(path: Path) -> tuple[CommRecord, dict]:
    """Decode and validate a comm run's run.json (`kind: "comm"`): (typed record, raw object).

    Raises InputError when the file is missing or not JSON, InvalidRecord when it breaks a rule
    (a training run's run.json breaks `kind`)."""
    raw = _decode_json(path)
    return _convert(path, raw, CommRecord), raw
