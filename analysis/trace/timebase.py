"""Event times relative to a per-trace base, so nanosecond resolution survives (docs §1).

Kineto writes `ts` in µs, either on its own relative clock (~4e12 µs; `baseTimeNanoseconds`
gives the epoch) or on the absolute epoch clock (~1.7e15 µs). As float64, 1.7e15 is only good to
0.25 µs and 4.4e12 to ~1 ns, so each trace gets a base `B` (an integer µs: the median of its first
1,001 `ts`, which a few hostile timestamps cannot move) and every `ts` becomes `ts − B` µs:

- a trace whose times are below 2⁴³ µs, or whole µs (float64 holds integers exactly), is
  rebased in float and snapped to whole nanoseconds: the float64 decode is within 0.49 ns of the
  text there, so this recovers the exact value written with up to 3 decimals (Kineto's ns);
- a trace with larger times and a fractional `ts` in its text (judged on its first chunk) has
  each chunk decoded a second time with `ts` as a Decimal (exact), and rebased from that.

The result: every time is exact to 1 ns, relative times up to one day keep ~10⁻⁵ ns of float64
precision, and the cross-rank alignment uses exact integer ns (`origin_ns`). A `ts` more than
`MAX_SPAN_US` (one day) from the base is implausible: it becomes NaN, which classify drops and
counts.
"""

from __future__ import annotations

import re
from decimal import Decimal
from operator import attrgetter

import msgspec
import numpy as np

__all__ = ["MAX_SPAN_US", "median_base", "needs_exact", "rebase"]

# Plausibility bound: no event lasts longer, or starts farther from the trace's base, than one
# day. A profiled window spans seconds to minutes; beyond this a time is corrupt, not slow.
MAX_SPAN_US = 86_400e6
_EXACT_BELOW = float(1 << 43)  # float64 ulp there is 2^-10 µs: under 1 ns, so snapping is exact
# A fractional `ts` with 13+ integer digits: the only text float64 cannot hold to the ns.
_BIG_FRACTION_RE = re.compile(rb'"ts"\s*:\s*-?\d{13,}\.')


class _ExactTs(msgspec.Struct, gc=False):
    ts: Decimal | None = None


_EXACT_DECODER = msgspec.json.Decoder(list[_ExactTs])
_TS = attrgetter("ts")


def median_base(ts: list[float]) -> int:
    """The base of a trace (integer µs): the median of its first 1,001 times (a count, not the
    chunk's byte size, so reformatting the file does not move the base)."""
    finite = sorted(t for t in ts[:1001] if -1e17 < t < 1e17)
    return round(finite[len(finite) // 2]) if finite else 0


def needs_exact(events: list, buf: bytes | memoryview) -> bool:
    """Whether a trace needs the exact (Decimal) decode of `ts`, judged on its first chunk: a time
    at or above 2⁴³ µs and a fractional `ts` in the text. Kineto writes one format per file."""
    ts = np.fromiter(map(_TS, events), np.float64, len(events))
    return bool((np.abs(ts) >= _EXACT_BELOW).any()) and bool(_BIG_FRACTION_RE.search(buf))


def rebase(events: list, buf: bytes | memoryview, base: int, *, exact: bool) -> np.ndarray:
    """Each event's `ts` (float µs as decoded from `buf`) as µs relative to `base` (the events
    are left as they are); NaN when absent, not finite or more than MAX_SPAN_US from the base.
    With `exact`, the times are decoded again from `buf` as Decimals (see the module docstring)."""
    if exact:
        try:
            times = _EXACT_DECODER.decode(buf)
        except msgspec.DecodeError:  # wrong-shaped events in the chunk: keep the float times
            times = None
        if times is not None and len(times) == len(events):
            return _rebase_exact(times, Decimal(base))
    ts = np.fromiter(map(_TS, events), np.float64, len(events)) - float(base)
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(ts) <= MAX_SPAN_US, np.round(ts * 1000) / 1000, np.nan)


def _rebase_exact(times: list[_ExactTs], base: Decimal) -> np.ndarray:
    span = Decimal(int(MAX_SPAN_US))
    out = np.full(len(times), np.nan)
    for i, x in enumerate(times):
        t = x.ts
        if t is not None and t.is_finite() and t.adjusted() < 18:  # no overflow below
            d = t - base
            if -span <= d <= span:
                out[i] = float(d)
    return out
