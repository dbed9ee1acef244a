"""Run-entry fields that one record decides alone (analysis.runs.entry builds the entry): the
memory peak and imbalance, the same-workload parts taken from the config, and the mean ± std
every group statistic uses (docs/reference/metrics.md §7).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from profiler.runfolder.schema import Config, RunRecord

__all__ = [
    "args_text",
    "device_type",
    "fixed_batch",
    "mean_std",
    "memory_peaks",
    "num_devices",
    "one_node_host",
]


def one_node_host(record: RunRecord) -> str | None:
    """`env.hostname` when the job ran on one node (`config.nnodes` 1), so every rank whose trace
    names no host was on it; None otherwise (it names one node of several)."""
    return record.env.hostname if record.config.nnodes == 1 else None


def memory_peaks(entries: list[dict]) -> dict:
    """Peak memory and imbalance over the run's memory entries (one per rank/device).

    Uses `peak_allocated_bytes` (CUDA) when every entry has it, else `peak_rss_bytes` (CPU runs).
    `memory_imbalance_pct` (the one imbalance definition) = (max / min − 1) × 100: how much more
    the fullest device holds than the emptiest. `memory_imbalance_max_over_mean` = max / mean is
    an extra column only.
    """
    out = {
        "memory_metric": None,
        "peak_memory_bytes": None,
        "memory_imbalance_pct": None,
        "memory_imbalance_max_over_mean": None,
    }
    for field in ("peak_allocated_bytes", "peak_rss_bytes"):
        values = [e.get(field) for e in entries]
        if values and all(isinstance(v, int | float) for v in values):
            hi, lo, mean = max(values), min(values), statistics.fmean(values)
            out.update(
                memory_metric=field,
                peak_memory_bytes=int(hi),
                memory_imbalance_pct=(hi / lo - 1) * 100 if lo > 0 else None,
                memory_imbalance_max_over_mean=hi / mean if mean > 0 else None,
            )
            break
    return out


def fixed_batch(config: Config) -> int | None:
    """The batch the scaling mode holds fixed; None for a script run, whose `workload` (script
    and arguments) already says what problem it ran, whatever batch split the script chose."""
    if config.workload is not None:
        return None
    return config.global_batch if config.scaling == "strong" else config.per_device_batch


def args_text(args: dict[str, Any] | None) -> str:
    """Factory keyword arguments as one comparable string, `k=v` sorted by key ("" for none):
    the form the same-workload key and the report's tables use."""
    text = {True: "true", False: "false"}
    return ",".join(
        f"{k}={text[v] if isinstance(v, bool) else v}" for k, v in sorted((args or {}).items())
    )


def device_type(config: Config) -> str | None:
    """`cpu`, `cuda`, ... from the run's first device (`cuda:1` -> `cuda`); None when unknown."""
    return config.devices[0].split(":", 1)[0] if config.devices else None


def num_devices(config: Config) -> int | None:
    """Devices a run spreads over: DDP ranks, DP's GPUs, 1 for single (efficiency's divisor);
    None for a skipped run whose layout was never decided."""
    if config.mode == "dp" and config.devices:
        return len(set(config.devices))
    return config.world_size


def mean_std(values: Iterable[Any]) -> tuple[float | None, float | None]:
    """Mean and sample std (n−1) of the finite numbers in `values`; non-numbers are ignored.
    (None, None) when there is none; the std is None for a single value."""
    vals = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)
