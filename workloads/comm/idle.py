"""The idle-penalty sweep of `make bench-comm` (workloads.comm.bench): all_reduce and broadcast
timed after each of `--gaps-ms` of compute, and right after that (back-to-back), at every other
benchmarked size and the largest; and the printed summary of it and of the host contention."""

from __future__ import annotations

import argparse

import pandas as pd
import torch

from workloads.comm.ops import time_one
from workloads.comm.options import parse_gaps

__all__ = ["SWEPT", "extra_lines", "idle_sweep", "sweep_bound_s", "sweep_sizes"]

SWEPT = ("all_reduce", "broadcast")
"""The collectives the idle-penalty sweep times: the ones DDP issues during a step."""


def sweep_sizes(sizes: list[int]) -> list[int]:
    """The sizes the idle-penalty sweep times: every other benchmarked size, and the largest."""
    return sorted({*sizes[::2], sizes[-1]})


def sweep_bound_s(names: list[str], sizes: list[int], gaps: tuple[float, ...], iters: int) -> float:
    """Seconds of compute gaps the sweep runs (its calls come on top): a lower bound."""
    return len(names) * len(sweep_sizes(sizes)) * (iters + 1) * sum(gaps) / 1e3


def idle_sweep(
    names: list[str], sizes: list[int], n: int, dev: torch.device, args: argparse.Namespace
) -> list[dict]:
    """run.json `metrics.idle_penalty`: per collective, size and gap, the mean of the call made
    after the gap of compute and of the same call right after it (one untimed iteration first),
    on the slowest rank, and the mean of that first call on the rank that arrived last
    (`time_us_mean_last_arrival`, workloads.comm.ops.time_one)."""
    out = []
    for name in names:
        for nbytes in sweep_sizes(sizes):
            count = nbytes // 4
            for gap in parse_gaps(args.gaps_ms):
                first, hot, last = time_one(
                    name, count, n, dev, 1, args.gap_iters, gap / 1e3, twice=True
                )
                out.append(
                    {
                        "collective": name,
                        "bytes": count * 4,
                        "gap_ms": gap,
                        "time_us_mean": float(first.mean() * 1e6),
                        "time_us_mean_back_to_back": float(hot.mean() * 1e6),
                        "time_us_mean_last_arrival": float(last.mean() * 1e6),
                    }
                )
    return out


def extra_lines(extra: dict) -> list[str]:
    """The printed summary of the idle-penalty sweep and of the host contention."""
    out = []
    if extra["idle_penalty"]:
        frame = pd.DataFrame(extra["idle_penalty"])
        frame["penalty_us"] = frame["time_us_mean"] - frame["time_us_mean_back_to_back"]
        table = frame.pivot_table(index=["collective", "bytes"], columns="gap_ms",
                                  values="penalty_us")  # fmt: skip
        out += ["# idle penalty (µs): mean after the gap − back-to-back; columns: gap (ms)"]
        out += ["  " + line for line in table.round(1).to_string().splitlines()]
        out.append(f"  (sweep took {extra['idle_sweep_s']:.1f} s)")
    host = extra["host_contention"]
    if host.get("slowdown"):
        pairs = ", ".join(
            f"×{s:.3f} at {k}" for k, s in zip(host["ranks"], host["slowdown"], strict=True)
        )
        out.append(f"# host contention (compute slowdown with k ranks busy at once): {pairs}")  # fmt: skip
        # the range the projection's band takes
        if host.get("slowdown_max") and host.get("windows"):
            lo, hi = host["slowdown_min"][-1], host["slowdown_max"][-1]
            out.append(f"  (median of {host['windows']} windows' rounds; ×{lo:.3f}–×{hi:.3f} at "
                       f"{host['ranks'][-1]} over the rounds)")  # fmt: skip
    elif host.get("note"):
        out.append(f"# host contention: {host['note']}")
    return out
