"""The multi-host test hook: `DPSCOPE_CLOCK_SHIFT=RANK:US[,RANK:US...]` makes a one-machine job's
traces look like a multi-host job's (docs/guides/multi-node-slurm.md).

Each listed rank's trace, once torch has exported it, has every event time moved by US µs (as
if its host's clock read US µs ahead of rank 0's; negative is behind), its clock probe's bounds
moved with them (profiler.runfolder.clockprobe), and its Kineto `host_name` replaced by
`<host>-shift<RANK>`, a host of its own. Ranks not listed keep the real clock and host. Rank 0's
clock is the one the probes are measured against, so rank 0 cannot be listed. The profiler
session reads the variable once, when it is built; a bad value is one ValueError line.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from profiler.runfolder.atomic import atomic_path
from profiler.runfolder.clockprobe import CLOCK_PROBE_KEY

__all__ = ["CLOCK_SHIFT_ENV", "apply_clock_shift", "clock_shift_us", "shifted_host"]

CLOCK_SHIFT_ENV = "DPSCOPE_CLOCK_SHIFT"
_ITEM_RE = re.compile(r"\s*(\d+)\s*:\s*([-+]?\d+(?:\.\d+)?)\s*")
MAX_SHIFT_US = 3.6e9
"""One hour: a test hook, not a way to move traces to another day."""


def clock_shift_us(rank: int, env: Mapping[str, str] = os.environ) -> float | None:
    """This rank's shift in µs from DPSCOPE_CLOCK_SHIFT (None when it is not listed)."""
    raw = env.get(CLOCK_SHIFT_ENV, "").strip()
    if not raw:
        return None
    shifts: dict[int, float] = {}
    for item in raw.split(","):
        m = _ITEM_RE.fullmatch(item)
        if not m or abs(float(m.group(2))) > MAX_SHIFT_US:
            raise ValueError(
                f"{CLOCK_SHIFT_ENV} must be RANK:US[,RANK:US...] with |US| <= {MAX_SHIFT_US:.0f}, "
                f"e.g. 1:-5000; got {raw!r}"
            )
        shifts[int(m.group(1))] = float(m.group(2))
    if 0 in shifts:
        raise ValueError(
            f"{CLOCK_SHIFT_ENV} cannot shift rank 0: its clock is the reference the others are "
            f"measured against; shift the other ranks instead (got {raw!r})"
        )
    return shifts.get(rank)


def shifted_host(host: str, rank: int) -> str:
    """The host name a shifted rank's trace gets: a host of its own."""
    return f"{host}-shift{rank}"


def apply_clock_shift(path: Path, shift_us: float, rank: int) -> None:
    """Move every event time of the exported trace `path` by `shift_us`, and its clock probe
    with them, and give it a host of its own; rewritten atomically, gzipped when the name ends
    in .gz. The reference rank's own trace cannot be shifted (ValueError)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    for event in trace.get("traceEvents", []):
        if isinstance(event, dict) and isinstance(event.get("ts"), int | float):
            event["ts"] = event["ts"] + shift_us
    if isinstance(probe := trace.get(CLOCK_PROBE_KEY), dict):
        if probe.get("reference_rank") == rank:
            raise ValueError(f"rank {rank} is the clock reference of {path}: it cannot be shifted")
        for key in ("offset_us_low", "offset_us_high"):
            if isinstance(probe.get(key), int | float):
                probe[key] = probe[key] + shift_us
    trace["host_name"] = shifted_host(str(trace.get("host_name") or "host"), rank)
    with atomic_path(path) as tmp, opener(tmp, "wt", encoding="utf-8") as f:
        json.dump(trace, f)
