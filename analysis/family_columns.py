"""Column specs of the data-parallel family's tables (analysis.runs.family) and of the collectives
split by phase, for the report (analysis.report.family_section) and the CLI (`dpscope runs`).
Kept beside analysis.columns, in the same conventions: units in the headers, MiB for memory,
MB next to bandwidths in GB/s.
"""

from __future__ import annotations

from analysis.columns import C, mib, ms_of_us, without

__all__ = ["CAPACITY_COLS", "CLI_FAMILY_COLS", "FAMILY_COLS", "PHASE_COLLECTIVE_COLS"]

FAMILY_COLS = [
    C(key="model", label="Model"),
    C(key="backend", label="Backend"),
    C(key="world_size", label="Ranks", kind="int"),
    C(key="label", label="Mode"),
    C(key="runs", label="Runs", unit="count", kind="int"),
    mib(key="model_state_bytes", label="Model state per rank"),
    mib(key="saved_bytes", label="Saved vs DDP"),
    C(key="saved_pct", label="Saved vs DDP", unit="% of DDP's", kind="num", digits=1),
    C(key="samples_per_s_mean", label="Throughput", unit="samples/s", kind="num", digits=1),
    C(key="throughput_vs_ddp_pct", label="Throughput", unit="% of DDP's", kind="num", digits=1),
]
CAPACITY_COLS = [
    C(key="model", label="Model"),
    C(key="world_size", label="Ranks", kind="int"),
    C(key="label", label="Mode"),
    C(key="bytes_per_param", label="Model state", unit="B per parameter", kind="num", digits=2),
    mib(key="fixed_bytes", label="Fixed (buffers)"),
    C(
        key="max_params",
        label="Largest model that fits",
        unit="M parameters",
        kind="num",
        digits=1,
        scale=1e-6,
    ),
    mib(key="budget_bytes", label="Budget per rank"),
    C(key="budget_source", label="Budget from", wrap=True),
]
PHASE_COLLECTIVE_COLS = [
    C(key="run_id", label="Run"),
    C(key="name", label="Collective"),
    C(key="phase", label="Issued in"),
    C(key="algorithm", label="Moved by"),
    C(key="calls", label="Calls", unit="count", kind="int"),
    C(key="bytes_avg", label="Bytes per call", unit="MB", kind="bytes"),
    ms_of_us(key="latency_us_total", label="Latency total", unit="ms"),
    ms_of_us(key="exposed_us_total", label="Exposed", unit="ms"),
    ms_of_us(key="overlapped_us_total", label="Overlapped", unit="ms"),
    C(key="algbw_gbps", label="algbw", unit="GB/s", kind="num", digits=3),
    C(key="busbw_gbps", label="busbw", unit="GB/s", kind="num", digits=3),
]
CLI_FAMILY_COLS = [
    *without(FAMILY_COLS, "model", "backend", "world_size", "runs"),
    C(key="bytes_per_param", label="Model state", unit="B per parameter", kind="num", digits=2),
]
