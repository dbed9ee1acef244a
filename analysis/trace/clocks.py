"""Per-host clock offsets from the collectives the ranks share, and their removal before any
cross-rank time comparison (definitions: docs/reference/metrics.md §6, "Clock alignment across hosts").

Every rank's Kineto times come from its own host's clock; across hosts those clocks differ by
hundreds of µs to milliseconds. The traces are first put on one origin (the earliest event of
all ranks, HTA's shift), which is exact on one host. Across hosts the remaining offset is
estimated from the matched collective calls (the k-th call of a name on every rank, as the
collective tables match them): a collective cannot complete on one rank before every rank has
entered it, so for each matched call k, with rank r's times on its clock and rank q's on the
reference clock,

    s_r,k − e_q,k  ≤  offset_r  ≤  e_r,k − s_q,k

(s = start, e = end of the call, in µs). The end times bound the offset from both sides: a late
arrival moves its own start, and the bound it gives is the tight one. Over all matched calls
the offset lies in [L, U] = [max of the lower bounds, min of the upper bounds]; the estimate is
its midpoint and the uncertainty its half-width. The most extreme 2% of bounds on each side are
dropped (more, up to 10%, while L > U): a few mis-matched calls cannot move the estimate.

Why not the median of end-time differences: on CPU (gloo) the ends are not simultaneous. A rank
that arrives late also finishes late, by the time its starved threads need to receive the last
message; measured on a 2-core machine against the wall clock, the median of end differences
was off by 27 to 1,300 µs on one host, while [L, U] always held the true offset.

A dpscope trace also carries a clock probe (profiler.runfolder.clockprobe): bounds on the same
offset from timestamp pings with rank 0 just before the window, ±15 µs on one host's loopback
where the collectives' bound is as wide as gloo's calls (milliseconds on CPU). Two ranks'
probes give the offset between them: [low_r − high_q, high_r − low_q]. A host's offset then
lies in the intersection of its probe interval and its collectives' [L, U]; when the two do not
meet (the clocks drifted between the probe and the window), the collectives' bound alone is
used, with a warning naming both intervals. Probes of another window than the reference rank's
(a different `probe_id`), or that conflict, are not used, with a warning. With no usable
collectives, the probe alone gives the offset.

Ranks on one host share one clock, so they share one offset: ranks whose traces name the same
host (Kineto's `host_name`) are pooled, and the host of the reference rank (the lowest rank,
normally 0) has offset 0 exactly. A rank whose trace names no host is estimated alone. Fewer
than MIN_SHARED_CALLS matched calls, or bounds that contradict each other, leave a host
unaligned with one warning.

`--clock-align`: `auto` removes an offset larger than its uncertainty, `force` removes every
estimated offset, `off` estimates nothing.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from profiler.runfolder.clockprobe import ClockProbe
from profiler.runfolder.errors import InputError

__all__ = [
    "CLOCK_ALIGN_MODES",
    "add_clock_align",
    "MIN_SHARED_CALLS",
    "ClockOffset",
    "align_clocks",
    "check_clock_align",
    "estimate_offsets",
    "host_groups",
    "offset_bounds",
    "probe_bounds",
]

CLOCK_ALIGN_MODES = ("off", "auto", "force")
MIN_SHARED_CALLS = 3
"""Fewer matched calls than this between a host and the reference host: left unaligned."""
TRIM_FRACTION = 0.02
"""Share of the most extreme bounds dropped on each side, always."""
MAX_TRIM_FRACTION = 0.10
"""The most that is dropped on each side while the bounds still contradict each other."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockOffset:
    """One rank's clock relative to the reference rank's."""

    offset_us: float | None
    """Rank clock minus reference clock at the same instant (µs); None when not estimable."""
    uncertainty_us: float | None
    """Half-width of the interval the offset is known to lie in (µs)."""
    calls: int
    """Matched collective calls the estimate used (0 for the reference host)."""
    source: str
    """`reference host`, `probe and collectives`, `clock probe`, `collectives` or `unaligned`
    (with the reason in the warnings)."""


def check_clock_align(mode: str) -> str:
    """`mode` if it is one of CLOCK_ALIGN_MODES, else one InputError line naming the flag."""
    if mode not in CLOCK_ALIGN_MODES:
        raise InputError("--clock-align", f"{mode!r} is not a mode", "use off, auto or force")
    return mode


def add_clock_align(parser: argparse.ArgumentParser) -> None:
    """The `--clock-align` option of every command that analyses traces."""
    parser.add_argument(
        "--clock-align",
        choices=CLOCK_ALIGN_MODES,
        default="auto",
        help="remove each host's clock offset before comparing times across ranks: auto = "
        "where it exceeds its uncertainty, force = always, off = never (docs/reference/metrics.md)",
    )


def host_groups(hosts: dict[int, str | None]) -> dict[int, list[int]]:
    """{first rank of the group: its ranks}: ranks naming one host together, a rank with no
    host alone."""
    groups: dict[object, list[int]] = defaultdict(list)
    for rank in sorted(hosts):
        host = hosts[rank]
        groups[("host", host) if host is not None else ("rank", rank)].append(rank)
    return {members[0]: members for members in groups.values()}


def _pair_bounds(mine: dict[str, dict], ref: dict[str, dict]) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds on (my clock − reference clock), one per matched call."""
    lows, highs = [], []
    for name in mine.keys() & ref.keys():
        a, b = mine[name], ref[name]
        m = min(a["start_us"].size, b["start_us"].size)
        lows.append(a["start_us"][:m] - b["end_us"][:m])
        highs.append(a["end_us"][:m] - b["start_us"][:m])
    if not lows:
        return np.empty(0), np.empty(0)
    return np.concatenate(lows), np.concatenate(highs)


def offset_bounds(lows: np.ndarray, highs: np.ndarray) -> tuple[float, float] | None:
    """[L, U] from the per-call bounds, the most extreme TRIM_FRACTION dropped on each side
    (more, up to MAX_TRIM_FRACTION, while L > U); None when they still contradict."""
    n = min(lows.size, highs.size)
    if n == 0:
        return None
    lows = np.sort(lows)[::-1]  # largest lower bound first
    highs = np.sort(highs)  # smallest upper bound first
    drop = int(n * TRIM_FRACTION)
    while drop <= int(n * MAX_TRIM_FRACTION):
        lo, hi = float(lows[drop]), float(highs[drop])
        if lo <= hi:
            return lo, hi
        drop += 1
    return None


def estimate_offsets(
    instances: dict[int, dict[str, dict]],
    hosts: dict[int, str | None],
    probes: dict[int, ClockProbe | None] | None = None,
) -> tuple[dict[int, ClockOffset], list[str]]:
    """Each rank's ClockOffset relative to the lowest rank, from its `rank_instances` (start_us
    and end_us on the common origin) and its clock probe where it has one, pooled per host;
    plus one warning per host left unaligned or whose probe was not used."""
    if not instances:
        return {}, []
    probes = probes or {}
    ref_rank = min(instances)
    groups = host_groups({r: hosts.get(r) for r in instances})
    ref_group = next(g for g, members in groups.items() if ref_rank in members)
    out: dict[int, ClockOffset] = {
        r: ClockOffset(offset_us=0.0, uncertainty_us=0.0, calls=0, source="reference host")
        for r in groups[ref_group]
    }
    warnings: list[str] = []
    for first, members in groups.items():
        if first == ref_group:
            continue
        pairs = [
            _pair_bounds(instances[r], instances[q]) for r in members for q in groups[ref_group]
        ]
        lows = np.concatenate([p[0] for p in pairs])
        highs = np.concatenate([p[1] for p in pairs])
        who = _who(members, hosts.get(first))
        probe = probe_bounds(members, groups[ref_group], probes)
        if probe is None and any(probes.get(r) is not None for r in members):
            warnings.append(
                f"{who}: its clock probe is not used — the reference rank has none, or of "
                "another window (a different probe_id), or its ranks' probes conflict"
            )
        offset, reason = _one_host(lows, highs, probe)
        if offset is None:
            warnings.append(f"{who}: clock left unaligned — {reason}")
        elif reason:
            warnings.append(f"{who}: {reason}")
        for r in members:
            out[r] = offset or ClockOffset(
                offset_us=None, uncertainty_us=None, calls=int(lows.size), source="unaligned"
            )
    return out, warnings


def probe_bounds(
    members: list[int], ref_members: list[int], probes: dict[int, ClockProbe | None]
) -> tuple[float, float] | None:
    """[low, high] of (the host's clock − the reference host's) from the probes of one window
    (the reference rank's `probe_id`): the intersection over every pair of a member and a
    reference-host rank that both carry one; None without such a pair, or when they conflict."""
    ref = [probes[q] for q in ref_members if probes.get(q) is not None]
    if not ref:
        return None
    window = ref[0].probe_id
    lo, hi = -np.inf, np.inf
    for p in (probes.get(r) for r in members):
        for q in ref:
            if p is None or p.probe_id != window or q.probe_id != window:
                continue
            if p.reference_rank != q.reference_rank:
                continue
            lo = max(lo, p.offset_us_low - q.offset_us_high)
            hi = min(hi, p.offset_us_high - q.offset_us_low)
    return (float(lo), float(hi)) if np.isfinite(lo) and lo <= hi else None


def _one_host(
    lows: np.ndarray, highs: np.ndarray, probe: tuple[float, float] | None
) -> tuple[ClockOffset | None, str]:
    """The offset of one host from its pooled per-call bounds and its probe interval, or None
    and why not; the reason is also set (with an offset) when the probe was not used."""
    calls = offset_bounds(lows, highs) if lows.size >= MIN_SHARED_CALLS else None
    n = int(lows.size)
    if probe is not None and calls is not None:
        lo, hi = max(probe[0], calls[0]), min(probe[1], calls[1])
        if lo <= hi:
            return _offset(lo, hi, n, "probe and collectives"), ""
        return _offset(*calls, n, "collectives"), (
            f"its clock probe ({probe[0]:.1f} to {probe[1]:.1f} µs) and its collectives "
            f"({calls[0]:.1f} to {calls[1]:.1f} µs) disagree — the collectives' bound is used "
            "(the clocks drifted between the probe and the traced window?)"
        )
    if probe is not None:
        return _offset(*probe, n, "clock probe"), ""
    if calls is not None:
        return _offset(*calls, n, "collectives"), ""
    if lows.size < MIN_SHARED_CALLS:
        return None, (
            f"{lows.size} collective call(s) shared with the reference rank, fewer than "
            f"{MIN_SHARED_CALLS}, and no usable clock probe; profile more steps so the ranks share "
            "collectives"
        )
    return None, (
        "its collective calls contradict each other (the k-th calls are not the same "
        "collective, or the traces are from different jobs or windows), and it has no clock "
        "probe of the reference rank's window"
    )


def _offset(lo: float, hi: float, calls: int, source: str) -> ClockOffset:
    return ClockOffset(offset_us=(lo + hi) / 2, uncertainty_us=(hi - lo) / 2, calls=calls,
                       source=source)  # fmt: skip


def _who(members: list[int], host: str | None) -> str:
    ranks = f"rank{'s' if len(members) > 1 else ''} {', '.join(map(str, members))}"
    return f"{ranks} (host {host})" if host is not None else f"{ranks} (no host in the trace)"


def align_clocks(
    instances: dict[int, dict[str, dict]],
    hosts: dict[int, str | None],
    mode: str,
    probes: dict[int, ClockProbe | None] | None = None,
) -> tuple[dict[int, ClockOffset | None], set[int], list[str]]:
    """Estimate the offsets (unless `mode` is off) and remove the applicable ones from each
    rank's instance start_us and end_us, in place: ({rank: offset or None}, ranks shifted,
    warnings). `auto` removes an offset larger than its uncertainty, `force` any estimate."""
    check_clock_align(mode)
    if mode == "off":
        return {r: None for r in instances}, set(), []
    offsets, warnings = estimate_offsets(instances, hosts, probes)
    shifted = set()
    for r, off in offsets.items():
        if off.offset_us is None or off.source == "reference host":
            continue
        if mode == "force" or abs(off.offset_us) > off.uncertainty_us:
            for inst in instances[r].values():
                inst["start_us"] = inst["start_us"] - off.offset_us
                inst["end_us"] = inst["end_us"] - off.offset_us
            shifted.add(r)
    return dict(offsets), shifted, warnings
