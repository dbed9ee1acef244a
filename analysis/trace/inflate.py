"""Gunzip a trace with its inflated size bounded as it streams (docs/reference/metrics.md §1),
with ISA-L (`isal`, about twice zlib's speed) where it is installed.

Two limits, both checked after every INFLATE_STEP_BYTES of output, so a decompression bomb stops
within one step of crossing either, in memory of that order, whatever the gzip header or trailer
claims:

- the size cap (`limit`, the loader's DPSCOPE_MAX_TRACE_BYTES): no trace inflates past it;
- the ratio cap: past RATIO_FLOOR_BYTES of output, the output may be at most `ratio` times the
  compressed bytes consumed so far (DPSCOPE_MAX_TRACE_RATIO, default MAX_RATIO). Kineto traces
  inflate 10-20x (the reference traces: 10.2-18.0x); deflate's own maximum is about 1032x, which
  is what a bomb of zeros or of one repeated event reaches. A 1 MB gzip that would inflate to
  1 GiB is refused after RATIO_FLOOR_BYTES plus one step, instead of being inflated and parsed.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from profiler.runfolder.errors import InputError

try:  # ISA-L inflates about twice as fast as zlib, with zlib's interface
    from isal import isal_zlib as _zlib

    _ERRORS: tuple[type[Exception], ...] = (zlib.error, _zlib.error)
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the fallback
    _zlib = zlib
    _ERRORS = (zlib.error,)

__all__ = [
    "INFLATE_STEP_BYTES",
    "MAX_RATIO",
    "MAX_RATIO_ENV",
    "RATIO_FLOOR_BYTES",
    "inflate_capped",
    "max_ratio",
]

MAX_RATIO = 200.0
MAX_RATIO_ENV = "DPSCOPE_MAX_TRACE_RATIO"
RATIO_FLOOR_BYTES = 16 << 20  # below this much output any ratio is fine (tiny, odd files)
INFLATE_STEP_BYTES = 4 << 20


def max_ratio() -> float:
    """The ratio cap: DPSCOPE_MAX_TRACE_RATIO when set to a number >= 1, else MAX_RATIO."""
    text = os.environ.get(MAX_RATIO_ENV)
    if text is None:
        return MAX_RATIO
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= 1:  # also NaN
        raise InputError(
            MAX_RATIO_ENV,
            f"{MAX_RATIO_ENV}={text[:40]!r} is not a ratio >= 1",
            f"set {MAX_RATIO_ENV} to a number such as 1000, or unset it",
        )
    return value


def _bomb(path: Path, what: str, fix: str) -> InputError:
    return InputError(path, what, fix)


def inflate_capped(path: Path, data: bytes, limit: int, size_fix: str) -> bytearray:
    """Gunzip every member of `data` under both caps (module docstring); InputError naming
    `path` for a bomb or a truncated/corrupt gzip. `size_fix` says how to raise the size cap."""
    ratio = max_ratio()
    out = bytearray()
    consumed = 0  # compressed bytes taken so far, over all members
    rest = data
    try:
        while rest:  # one pass per gzip member (Kineto writes one)
            d = _zlib.decompressobj(wbits=31)
            buf = rest
            while not d.eof:
                chunk = d.decompress(buf, INFLATE_STEP_BYTES)
                # What this call took: not what is left for it, nor the next member's bytes.
                consumed += len(buf) - len(d.unconsumed_tail) - len(d.unused_data)
                buf = d.unconsumed_tail
                out += chunk
                if len(out) > limit:
                    raise _bomb(
                        path,
                        f"inflates to more than {limit:,} bytes (the trace size cap)",
                        size_fix,
                    )
                if len(out) > RATIO_FLOOR_BYTES and len(out) > ratio * consumed:
                    raise _bomb(
                        path,
                        f"inflates to more than {ratio:g}x its compressed size (a decompression "
                        f"bomb: {len(out):,} bytes from {consumed:,})",
                        f"raise {MAX_RATIO_ENV} if this trace is genuine",
                    )
                if not chunk and not buf:
                    raise EOFError  # input used up before the member's end
            rest = d.unused_data
    except (EOFError, *_ERRORS):
        raise InputError(
            path, "truncated or corrupt gzip", "the trace was cut off while writing; re-profile"
        ) from None
    return out
