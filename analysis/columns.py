"""Column specs of every table, in the report and in the `python -m analysis` CLI: key in the
row dict, header label, unit and display kind.

Units live in the headers so every number on the page has one; `kind` picks the display format.
Each table keeps to one byte convention, named in its units: binary MiB (2^20 B) for memory,
decimal MB (10^6 B) where bytes stand next to bandwidths in GB/s (10^9 B/s), as in nccl-tests.
No plotting or pandas here: the CLI imports this module alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from analysis.jsonsafe import clip

__all__ = [
    "BYTE_UNITS",
    "Column",
    "diff_columns",
    "fmt",
    "mib",
    "missing",
    "ms_of_us",
    "without",
]

BYTE_UNITS = {"MiB": 2**20, "MB": 10**6}
CELL_CHARS = 2000  # longest text shown in one table cell


@dataclass(frozen=True, kw_only=True)
class Column:
    """One table column: `key` in the row dict, header `label` with its `unit`, display `kind`."""

    key: str
    label: str
    unit: str = ""
    kind: str = "text"  # text | num | int | bytes | frac_pct | pm | ci | link
    digits: int = 2
    std_key: str | None = None  # kind "pm": the row key holding the standard deviation
    # kind "ci": the row keys holding the interval's ends (the value is its median)
    ci_keys: tuple[str, str] | None = None
    scale: float = 1.0  # kinds "num"/"pm": shown value = stored value × scale (ratio → %)
    wrap: bool = False  # long free text (reasons, links) may wrap; ids and numbers never do
    # The row key of a text that replaces the number when present (the runs JSON decides it:
    # a profiler overhead within noise shows as "within noise (±N%)"); the raw value stays.
    text_key: str | None = None
    # kind "num": the row key of the count the number is over, shown after it ("812.4 (12
    # steps)") so the two need one column; `count_unit` names what is counted.
    count_key: str | None = None
    count_unit: str = ""

    def __post_init__(self) -> None:
        kinds = {"text", "num", "int", "bytes", "frac_pct", "pm", "ci", "links"}
        if self.kind not in kinds:
            raise ValueError(f"Column {self.key}: kind must be one of {sorted(kinds)}")
        if self.kind == "pm" and not self.std_key:
            raise ValueError(f"Column {self.key}: kind 'pm' needs std_key")
        if self.kind == "ci" and not self.ci_keys:
            raise ValueError(f"Column {self.key}: kind 'ci' needs ci_keys")
        if self.kind == "bytes" and self.unit not in BYTE_UNITS:
            raise ValueError(f"Column {self.key}: kind 'bytes' needs a unit in {list(BYTE_UNITS)}")

    @property
    def header(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else self.label

    @property
    def numeric(self) -> bool:
        return self.kind not in ("text", "links")


def missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def fmt(value: Any, col: Column, row: dict[str, Any] | None = None) -> str:
    """Display text for one cell (units are in the header); missing values show as an em dash."""
    if col.text_key and isinstance(text := (row or {}).get(col.text_key), str) and text:
        return clip(text, CELL_CHARS)
    if missing(value):
        return "—"
    if col.kind == "bytes":
        return f"{value / BYTE_UNITS[col.unit]:,.1f}"
    if col.kind == "frac_pct":
        return f"{value * 100:.1f}"
    if col.kind == "int":
        return f"{int(value):,}"
    if col.kind == "ci":  # median [low–high], the interval left out when it is one point
        ends = [(row or {}).get(k) for k in col.ci_keys or ()]
        text = f"{value * col.scale:,.{col.digits}f}"
        if any(missing(e) for e in ends) or ends[0] == ends[1]:
            return text
        lo, hi = (f"{e * col.scale:,.{col.digits}f}" for e in ends)
        return f"{text} [{lo}–{hi}]"
    if col.kind in ("num", "pm"):
        text = f"{value * col.scale:,.{col.digits}f}"
        std = (row or {}).get(col.std_key) if col.kind == "pm" else None
        if not missing(std):
            return f"{text} ± {std * col.scale:,.{col.digits}f}"
        count = (row or {}).get(col.count_key) if col.count_key else None
        return f"{text} ({int(count):,} {col.count_unit})" if not missing(count) else text
    # Record strings are already clipped one by one (build._display, the CLI's _table); this bound
    # only stops a cell that joins many of them from growing without limit.
    if isinstance(value, list):
        return clip(", ".join(map(str, value)), CELL_CHARS) or "—"
    return clip(str(value), CELL_CHARS)


def without(cols: Sequence[Column], *keys: str) -> list[Column]:
    """`cols` minus the columns with these keys (the CLI's tables are the report's, less some)."""
    return [c for c in cols if c.key not in keys]


def ms_of_us(*, key: str, label: str, unit: str = "ms/step") -> Column:
    """A time stored in µs, shown in ms with 2 digits (the traces JSON keeps µs, as HTA does)."""
    return Column(key=key, label=label, unit=unit, kind="num", digits=2, scale=1e-3)


def num1(*, key: str, label: str, unit: str, scale: float = 1.0) -> Column:
    """A number shown with 1 digit (shares in %, times scaled to ms)."""
    return Column(key=key, label=label, unit=unit, kind="num", digits=1, scale=scale)


def mib(*, key: str, label: str) -> Column:
    """A byte count shown in MiB."""
    return Column(key=key, label=label, unit="MiB", kind="bytes")


def ci(stat: str, *, label: str, unit: str, digits: int = 2, scale: float = 1.0) -> Column:
    """A group's median of `stat` over its rounds with the 95% bootstrap interval
    (analysis.runs.rounds: `<stat>_median`, `<stat>_ci95_low`, `<stat>_ci95_high`)."""
    return Column(key=f"{stat}_median", label=label, unit=f"{unit}, median [95% CI]", kind="ci",
                  digits=digits, scale=scale, ci_keys=(f"{stat}_ci95_low", f"{stat}_ci95_high"))  # fmt: skip


# The figures over rounds (analysis.runs.rounds), shared by the speedup and headline tables.
ROUND_COLS = [
    Column(key="n_rounds", label="Rounds", unit="runs", kind="int"),
    ci("speedup", label="Speedup", unit="×"),
    ci("scaling_efficiency", label="Efficiency", unit="%", digits=1, scale=100.0),
    Column(key="throughput_basis", label="Steps used", unit="quiet | all | mixed"),
]


# The baseline's noise: per run in the summary's CSV, per group on the speedup table's page.
NOISE_COL = Column(
    key="baseline_noise_pct",
    label="Noise",
    unit="% spread of the single runs",
    kind="num",
    digits=1,
)

SUMMARY_COLS = [
    Column(key="run_id", label="Run"),
    Column(key="status", label="Status"),
    Column(key="mode", label="Mode"),
    Column(key="backend", label="Backend"),
    Column(key="world_size", label="World size", unit="ranks", kind="int"),
    Column(key="samples_per_s", label="Throughput", unit="samples/s", kind="num", digits=1),
    Column(
        key="samples_per_s_quiet",
        label="Throughput, quiet steps",
        unit="samples/s (steps)",
        kind="num",
        digits=1,
        count_key="quiet_steps",
        count_unit="steps",
    ),
    Column(
        key="quiet_steps", label="Quiet steps", unit="count", kind="int"
    ),  # CSV only: in the above
    Column(key="throughput_basis", label="Steps used", unit="quiet | all"),
    Column(key="speedup", label="Speedup vs single", unit="×", kind="num"),
    Column(key="scaling_efficiency", label="Scaling efficiency", unit="%", kind="frac_pct"),
    Column(key="comm_pct", label="Comm share", unit="% of step", kind="num", digits=1),
    Column(key="exposed_comm_pct", label="Exposed comm", unit="% of step", kind="num", digits=1),
    mib(key="peak_memory_bytes", label="Peak memory"),
    num1(key="memory_imbalance_pct", label="Memory imbalance", unit="% more, fullest vs emptiest"),
    NOISE_COL,
    Column(
        key="profiler_overhead_pct",
        label="Profiler overhead",
        unit="% per traced step",
        kind="num",
        digits=1,
        text_key="profiler_overhead_note",
    ),  # fmt: skip
    Column(key="top1_pct", label="Top-1", unit="%", kind="num"),
    Column(key="os", label="Platform"),
    Column(key="label", label="Label"),
    Column(key="reason", label="Reason / notes", wrap=True),
]
PHASE_COLS = [
    Column(key="run_id", label="Run"),
    Column(key="rank", label="Rank", kind="int"),
    Column(key="data_s", label="Data wait", unit="ms/step", kind="num", digits=1, scale=1e3),
    Column(key="forward_s", label="Forward", unit="ms/step", kind="num", digits=1, scale=1e3),
    num1(
        key="backward_compute_s", label="Backward (excl. exposed comm)", unit="ms/step", scale=1e3
    ),
    Column(
        key="exposed_comm_s", label="Exposed comm", unit="ms/step", kind="num", digits=1, scale=1e3
    ),
    Column(key="optimizer_s", label="Optimizer", unit="ms/step", kind="num", digits=1, scale=1e3),
    Column(key="other_s", label="Other", unit="ms/step", kind="num", digits=1, scale=1e3),
    Column(key="step_time_s", label="Step", unit="ms/step", kind="num", digits=1, scale=1e3),
]
COLLECTIVE_COLS = [
    Column(key="run_id", label="Run"),
    Column(key="name", label="Collective"),
    Column(key="algorithm", label="Moved by"),  # the backend's own op (analysis.trace.c10d)
    Column(key="calls", label="Calls", unit="count", kind="int"),
    Column(key="bytes_total", label="Bytes total", unit="MB", kind="bytes"),
    Column(key="bytes_avg", label="Bytes per call", unit="MB", kind="bytes"),
    Column(
        key="latency_us_avg", label="Latency per call", unit="ms", kind="num", digits=3, scale=1e-3
    ),
    ms_of_us(key="latency_us_total", label="Latency total", unit="ms"),
    ms_of_us(key="transfer_us_total", label="Transfer", unit="ms"),
    ms_of_us(key="sync_us_total", label="Sync wait", unit="ms"),
    ms_of_us(
        key="latency_us_union",
        label="Latency union (extra: time any call was in flight)",
        unit="ms",
    ),
    Column(key="algbw_gbps", label="algbw", unit="GB/s", kind="num", digits=3),
    Column(key="busbw_gbps", label="busbw", unit="GB/s", kind="num", digits=3),
]
OVERLAP_COLS = [
    Column(key="run_id", label="Run"),
    Column(key="rank", label="Rank", kind="int"),
    Column(key="steps", label="Steps analysed", unit="count", kind="int"),
    ms_of_us(key="step_time_us_mean", label="Step", unit="ms"),
    ms_of_us(key="comm_us", label="Comm"),
    ms_of_us(key="exposed_comm_us", label="Exposed comm"),
    Column(key="overlap_pct", label="Overlap (HTA)", unit="% of comm", kind="num", digits=1),
    ms_of_us(key="tb_computation", label="tb: computation"),
    ms_of_us(key="tb_overlapping", label="tb: overlapping"),
    ms_of_us(key="tb_communication", label="tb: communication"),
    ms_of_us(key="tb_other", label="tb: other"),
]
STRAGGLER_COLS = [
    Column(key="run_id", label="Run"),
    Column(key="rank", label="Rank", kind="int"),
    ms_of_us(key="start_skew_us_mean", label="Collective start skew, mean", unit="ms"),
    ms_of_us(key="start_skew_us_max", label="Collective start skew, max", unit="ms"),
    Column(key="straggler_score", label="Straggler score", unit="ratio", kind="num"),
    Column(key="clock_offset_us", label="Clock offset vs rank 0", unit="µs", kind="num", digits=1),
    Column(key="clock_offset_uncertainty_us", label="± (offset)", unit="µs", kind="num", digits=1),
    Column(key="spread_pct", label="Step-time spread over ranks", unit="%", kind="num", digits=1),
]
MEMORY_COLS = [
    Column(key="run_id", label="Run"),
    Column(key="rank", label="Rank", kind="int"),
    Column(key="device", label="Device"),
    mib(key="peak_allocated_bytes", label="Peak allocated"),
    mib(key="peak_reserved_bytes", label="Peak reserved"),
    mib(key="nvml_used_bytes", label="NVML used"),
    mib(key="peak_rss_bytes", label="Peak RSS"),
    num1(key="memory_imbalance_pct", label="Run imbalance", unit="% more, fullest vs emptiest"),
    Column(
        key="memory_imbalance_max_over_mean",
        label="Run imbalance (extra: fullest ÷ mean)",
        unit="ratio",
        kind="num",
    ),
]
SPEEDUP_COLS = [
    Column(key="model", label="Model"),
    Column(key="mode", label="Mode"),
    Column(key="backend", label="Backend"),
    Column(key="os", label="Platform"),
    Column(key="world_size", label="World size", unit="ranks", kind="int"),
    Column(key="n_seeds", label="Seeds", unit="count", kind="int"),
    Column(
        key="samples_per_s_mean",
        label="Throughput",
        unit="samples/s, mean ± std",
        kind="pm",
        digits=1,
        std_key="samples_per_s_std",
    ),
    Column(key="samples_per_s_min", label="Throughput min", unit="samples/s", kind="num", digits=1),
    Column(key="samples_per_s_max", label="Throughput max", unit="samples/s", kind="num", digits=1),
    Column(
        key="speedup_mean",
        label="Speedup vs single",
        unit="×, mean ± std",
        kind="pm",
        std_key="speedup_std",
    ),
    Column(
        key="scaling_efficiency_mean",
        label="Scaling efficiency",
        unit="%, mean ± std",
        kind="pm",
        digits=1,
        scale=100.0,
        std_key="scaling_efficiency_std",
    ),
    *ROUND_COLS,
    Column(key="comm_pct_mean", label="Comm share", unit="% of step, mean", kind="num", digits=1),
    Column(
        key="exposed_comm_pct_mean",
        label="Exposed comm",
        unit="% of step, mean",
        kind="num",
        digits=1,
    ),
    NOISE_COL,  # the group its speedup is over
]
ACCURACY_COLS = [
    Column(key="model", label="Model"),
    Column(key="dataset", label="Dataset"),
    Column(key="mode", label="Mode"),
    Column(key="backend", label="Backend"),
    Column(key="world_size", label="World size", unit="ranks", kind="int"),
    Column(key="os", label="Platform"),
    Column(key="n_seeds", label="Seeds", unit="count", kind="int"),
    Column(
        key="test_loss_mean",
        label="Test loss",
        unit="the --loss (nats for cross_entropy), mean ± std",
        kind="pm",
        std_key="test_loss_std",
        digits=4,
    ),
    Column(
        key="top1_pct_mean", label="Top-1", unit="%, mean ± std", kind="pm", std_key="top1_pct_std"
    ),
    Column(
        key="top5_pct_mean", label="Top-5", unit="%, mean ± std", kind="pm", std_key="top5_pct_std"
    ),
    # Sequence outputs (gpt): exp(mean token cross-entropy); empty for class scores.
    Column(
        key="perplexity_mean",
        label="Perplexity",
        unit="mean ± std",
        kind="pm",
        std_key="perplexity_std",
    ),
    Column(
        key="samples_per_s_mean",
        label="Throughput",
        unit="samples/s, mean ± std",
        kind="pm",
        std_key="samples_per_s_std",
        digits=1,
    ),
]
ENV_COLS = [
    Column(key="os", label="Platform"),
    Column(key="backend", label="Backend"),
    Column(key="run_id", label="Run"),
    Column(key="platform", label="OS release"),
    Column(key="cpu_model", label="CPU"),
    Column(key="gpus", label="GPUs"),
    Column(key="python", label="Python"),
    Column(key="torch", label="torch"),
    Column(key="cuda", label="CUDA"),
    Column(key="nccl", label="NCCL"),
    Column(key="devices", label="Devices"),
    Column(key="threads_per_rank", label="Threads per rank", unit="count", kind="int"),
    Column(key="hostname", label="Host"),
]
TRACE_COLS = [
    Column(key="run_id", label="Run"),
    Column(key="status", label="Status"),
    Column(key="kind", label="Trace kind"),
    Column(key="trace_links", label="Trace files", kind="links", wrap=True),
    Column(key="log_links", label="Logs", kind="links", wrap=True),
]


# --- operators (report "Operators" / "What DDP adds"; python -m analysis ops | diff)
def diff_columns(a: str, b: str, *, digits: int, wrap: bool = False) -> list[Column]:
    """Columns of an operator diff (`analysis diff`, "What DDP adds"), sides named `a` and `b`."""
    return [
        Column(key="name", label="Operator", wrap=wrap),
        Column(key="kind", label="Kind"),
        Column(key="status", label="Status"),
        Column(key="calls_per_step_a", label=f"Calls{a}", unit="per step", kind="num", digits=1),
        Column(key="calls_per_step_b", label=f"Calls{b}", unit="per step", kind="num", digits=1),
        Column(
            key="self_us_per_step_a", label=f"Self{a}", unit="µs/step", kind="num", digits=digits
        ),
        Column(
            key="self_us_per_step_b", label=f"Self{b}", unit="µs/step", kind="num", digits=digits
        ),
        Column(key="delta_us_per_step", label="Δ self", unit="µs/step", kind="num", digits=digits),
        Column(key="delta_pct", label="Δ self", unit="%", kind="num", digits=1),
        Column(key="delta_us_per_sample", label="Δ self", unit="µs/sample", kind="num", digits=2),
    ]


DDP_ADDS_COLS = diff_columns(", single", ", DDP", digits=0, wrap=True)
OPS_COLS = [
    Column(key="name", label="Operator", wrap=True),
    Column(key="kind", label="Kind"),
    Column(key="calls_per_step", label="Calls", unit="per step", kind="num", digits=1),
    Column(key="self_us_per_step", label="Self", unit="µs/step", kind="num", digits=0),
    Column(key="total_us_per_step", label="Total", unit="µs/step", kind="num", digits=0),
    Column(key="pct_of_step", label="Self", unit="% of step", kind="num", digits=1),
]


# --- the CLI's tables (python -m analysis traces | runs): the report's columns, less the run id
CLI_RANK_COLS = [
    *without(OVERLAP_COLS, "run_id"),
    Column(key="compute_us", label="Compute", unit="µs/step", kind="num", digits=0),
    Column(key="idle_pct", label="Idle", unit="% of step", kind="num", digits=1),
    Column(key="data_wait_us", label="Data wait", unit="µs/step", kind="num", digits=0),
]
CLI_COLLECTIVE_COLS = without(COLLECTIVE_COLS, "run_id")
CLI_STRAGGLER_COLS = without(STRAGGLER_COLS, "run_id", "spread_pct")
CLI_RUN_COLS = [
    *without(SUMMARY_COLS, "peak_memory_bytes", "os", "label", "reason"),
    Column(key="phases_ms", label="Data/fwd/bwd/opt", unit="ms/step"),
    Column(key="overlap_pct", label="Overlap (HTA)", unit="% of comm", kind="num", digits=1),
    Column(key="test_loss", label="Test loss", unit="nats", kind="num", digits=4),
]
CLI_GROUP_COLS = [*SPEEDUP_COLS, *(c for c in ACCURACY_COLS if c.key == "top1_pct_mean")]

# The sweep headline (analysis.report.scaling.headline_rows): one row per group of seeds.
HEADLINE_COLS = [
    Column(key="os", label="Platform"),
    Column(key="backend", label="Backend"),
    Column(key="mode", label="Mode"),
    Column(key="world_size", label="World size", unit="devices", kind="int"),
    Column(key="model", label="Model"),
    Column(key="dataset", label="Dataset"),
    Column(key="scaling", label="Scaling"),
    Column(key="batch", label="Batch", unit="global; per device for weak", kind="int"),
    Column(key="n_seeds", label="Seeds", unit="count", kind="int"),
    Column(key="epoch_time_s", label="Time per epoch", unit="s", kind="num", digits=2),
    Column(
        key="samples_per_s_mean",
        label="Throughput",
        unit="samples/s, mean ± std",
        kind="pm",
        digits=1,
        std_key="samples_per_s_std",
    ),
    Column(
        key="speedup_mean", label="Speedup", unit="×, mean ± std", kind="pm", std_key="speedup_std"
    ),
    Column(
        key="scaling_efficiency_mean",
        label="Efficiency",
        unit="%, mean ± std",
        kind="pm",
        digits=1,
        scale=100.0,
        std_key="scaling_efficiency_std",
    ),
    *ROUND_COLS,
    mib(key="peak_memory_bytes", label="Peak memory / device"),
    Column(
        key="top1_pct_mean", label="Top-1", unit="%, mean ± std", kind="pm", std_key="top1_pct_std"
    ),
]
# Where the efficiency went (analysis.runs.efficiency): one row per DDP group with a baseline.
EFFICIENCY_LOSS_COLS = [
    Column(key="group", label="Group"),
    Column(key="scaling_efficiency_mean", label="Efficiency", unit="%", kind="frac_pct"),
    Column(key="loss_pts", label="Lost", unit="points", kind="num", digits=1),
    Column(key="exposed_comm", label="Exposed comm", unit="pts", kind="num", digits=1),
    Column(key="stragglers", label="Waiting for slowest rank", unit="pts", kind="num", digits=1),
    Column(key="data", label="Data loading", unit="pts", kind="num", digits=1),
    Column(key="ddp_overhead", label="DDP overhead", unit="pts", kind="num", digits=1),
    Column(key="host_contention", label="Host contention", unit="pts", kind="num", digits=1),
    Column(key="contention", label="Compute contention", unit="pts", kind="num", digits=1),
    Column(key="residual", label="Residual", unit="pts", kind="num", digits=1),
]

# The data-parallel family's tables (analysis.runs.family, .familyview) and the collectives split by the
# phase that issued them, for the report (analysis.report.family_section) and `dpscope runs`.
FAMILY_COLS = [
    Column(key="model", label="Model"),
    Column(key="backend", label="Backend"),
    Column(key="world_size", label="Ranks", kind="int"),
    Column(key="label", label="Mode"),
    Column(key="runs", label="Runs", unit="count", kind="int"),
    mib(key="model_state_bytes", label="Model state per rank"),
    mib(key="saved_bytes", label="Saved vs DDP"),
    Column(key="saved_pct", label="Saved vs DDP", unit="% of DDP's", kind="num", digits=1),
    Column(key="samples_per_s_mean", label="Throughput", unit="samples/s", kind="num", digits=1),
    Column(
        key="throughput_vs_ddp_pct", label="Throughput", unit="% of DDP's", kind="num", digits=1
    ),
]
CAPACITY_COLS = [
    Column(key="model", label="Model"),
    Column(key="world_size", label="Ranks", kind="int"),
    Column(key="label", label="Mode"),
    Column(
        key="bytes_per_param", label="Model state", unit="B per parameter", kind="num", digits=2
    ),
    mib(key="fixed_bytes", label="Fixed (buffers)"),
    Column(
        key="max_params",
        label="Largest model that fits",
        unit="M parameters",
        kind="num",
        digits=1,
        scale=1e-6,
    ),
    mib(key="budget_bytes", label="Budget per rank"),
    Column(key="budget_source", label="Budget from", wrap=True),
]
PHASE_COLLECTIVE_COLS = [
    Column(key="run_id", label="Run"),
    Column(key="name", label="Collective"),
    Column(key="phase", label="Issued in"),
    Column(key="algorithm", label="Moved by"),
    Column(key="calls", label="Calls", unit="count", kind="int"),
    Column(key="bytes_avg", label="Bytes per call", unit="MB", kind="bytes"),
    ms_of_us(key="latency_us_total", label="Latency total", unit="ms"),
    ms_of_us(key="exposed_us_total", label="Exposed", unit="ms"),
    ms_of_us(key="overlapped_us_total", label="Overlapped", unit="ms"),
    Column(key="algbw_gbps", label="algbw", unit="GB/s", kind="num", digits=3),
    Column(key="busbw_gbps", label="busbw", unit="GB/s", kind="num", digits=3),
]
CLI_FAMILY_COLS = [
    *without(FAMILY_COLS, "model", "backend", "world_size", "runs"),
    Column(
        key="bytes_per_param", label="Model state", unit="B per parameter", kind="num", digits=2
    ),
]
