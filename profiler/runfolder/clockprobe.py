"""The clock probe a dpscope trace carries (docs/reference/metrics.md §6, "Clock alignment
across hosts"): where its host's clock stood against rank 0's when the trace began.

Just before each traced window, every rank of a multi-process job exchanges a few dozen
timestamp pings with rank 0 over a direct TCP connection (profiler.clockexchange). Rank 0 sends
at t1 and receives the reply at t4 (its clock); the rank stamps t2 and t3 between them (its
clock). A reply cannot arrive before it was sent, so for every ping

    t3 − t4  ≤  offset  ≤  t2 − t1        (offset = rank's clock − rank 0's clock)

and over all pings the offset lies in [max(t3 − t4), min(t2 − t1)]: the half-width is about
half the shortest round trip (~15 µs on one host's loopback, tens of µs across a LAN), where
the bound from the traced collectives is as wide as gloo's calls (milliseconds on CPU).

The interval is written into the rank's Kineto trace as the top-level JSON key
`dpscope_clock_probe` (torch's `profile.add_metadata_json`), so a trace folder alone carries it.
Torch-free: the profiler writes it and analysis/ reads it with these names.
"""

from __future__ import annotations

import math

import msgspec

__all__ = ["CLOCK_PROBE_KEY", "ClockProbe", "decode_clock_probe"]

CLOCK_PROBE_KEY = "dpscope_clock_probe"
"""The top-level key of a Kineto trace that holds the rank's ClockProbe (JSON)."""


class ClockProbe(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One rank's clock against the reference rank's, measured just before its traced window."""

    reference_rank: int
    """The rank whose clock the interval is relative to (0)."""
    offset_us_low: float
    """Lower bound of (this rank's clock − the reference rank's clock), µs."""
    offset_us_high: float
    """Upper bound of the same, µs; [low, high] holds the offset when the probe ran."""
    pings: int
    """Round trips the bounds were taken over (0 on the reference rank itself)."""
    probe_id: str
    """Random id shared by every rank of one probe: traces of one job's window carry one id."""


def decode_clock_probe(raw: bytes) -> ClockProbe | None:
    """The ClockProbe in `raw` (JSON of the trace's `dpscope_clock_probe`), or None when it is
    not one (the wrong shape, bounds that are not finite or not ordered)."""
    try:
        probe = msgspec.json.decode(raw, type=ClockProbe)
    except msgspec.DecodeError:
        return None
    low, high = probe.offset_us_low, probe.offset_us_high
    ok = math.isfinite(low) and math.isfinite(high) and low <= high
    return probe if ok and probe.reference_rank >= 0 and probe.pings >= 0 else None
