"""Read a trace's bytes: a regular file under the size cap, gunzipped with its inflated size
bounded as it streams (docs/reference/metrics.md §1), with ISA-L (`isal`, about twice zlib's
speed) where it is installed.

Two limits, both checked after every INFLATE_STEP_BYTES of output, so a decompression bomb stops
within one step of crossing either, in memory of that order, whatever the gzip header or trailer
claims:

- the size cap (`limit`: MAX_TRACE_BYTES, or DPSCOPE_MAX_TRACE_BYTES): no trace inflates past it;
- the ratio cap: past RATIO_FLOOR_BYTES of output, the output may be at most `ratio` times the
  compressed bytes consumed so far (DPSCOPE_MAX_TRACE_RATIO, default MAX_RATIO). Kineto traces
  inflate 10-20x (the reference traces: 10.2-18.0x); deflate's own maximum is about 1032x, which
  is what a bomb of zeros or of one repeated event reaches. A 1 MB gzip that would inflate to
  1 GiB is refused after RATIO_FLOOR_BYTES plus one step, instead of being inflated and parsed.
"""

from __future__ import annotations

import os
import stat
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
    "MAX_TRACE_BYTES",
    "MAX_TRACE_BYTES_ENV",
    "RATIO_FLOOR_BYTES",
    "inflate_capped",
    "max_ratio",
    "max_trace_bytes",
    "read_trace_bytes",
]

# The trace size cap (JSON bytes after gunzip), stated in docs §1: ~40x the largest reference
# trace's 54 MB; a 10 GiB bomb of zeros or JSON stops here, not in the decoder.
MAX_TRACE_BYTES = 2 << 30
MAX_TRACE_BYTES_ENV = "DPSCOPE_MAX_TRACE_BYTES"
MAX_RATIO = 200.0
MAX_RATIO_ENV = "DPSCOPE_MAX_TRACE_RATIO"
RATIO_FLOOR_BYTES = 16 << 20  # below this much output any ratio is fine (tiny, odd files)
INFLATE_STEP_BYTES = 1 << 20  # output stays in cache until copied out: ~8% faster than 4 MiB


def max_ratio() -> float:
    """The ratio cap: DPSCOPE_MAX_TRACE_RATIO when set to a number >= 1, else MAX_RATIO."""
    return _env_number(MAX_RATIO_ENV, MAX_RATIO, float, "a ratio >= 1", "a number such as 1000")


def _env_number(name: str, default: float, parse: type, what: str, example: str) -> float:
    """`name` parsed by `parse` when set (a value >= 1; NaN is not), else `default`; anything
    else is one line naming the variable."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = parse(text)
    except ValueError:
        value = 0
    if not value >= 1:  # also NaN
        raise InputError(
            name, f"{name}={text[:40]!r} is not {what}", f"set {name} to {example}, or unset it"
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


def max_trace_bytes() -> int:
    """The cap on a trace's size (bytes of JSON, after gunzip): `DPSCOPE_MAX_TRACE_BYTES`, else
    MAX_TRACE_BYTES. A file or an inflated gzip beyond it is refused (a decompression bomb)."""
    return _env_number(
        MAX_TRACE_BYTES_ENV, MAX_TRACE_BYTES, int, "a positive number of bytes",
        "a byte count, e.g. 8589934592",
    )  # fmt: skip


def _refuse_size(path: Path, what: str, limit: int) -> InputError:
    return InputError(
        path,
        f"{what} more than {limit:,} bytes (the trace size cap)",
        f"raise it with {MAX_TRACE_BYTES_ENV}=<bytes> if this trace is genuine",
    )


def _read_regular(path: Path, limit: int) -> bytearray:
    """The bytes of `path`, a regular file of at most `limit` bytes (one more when it grew past
    it while read); opened non-blocking, so a FIFO or a device is refused at once instead of
    hanging. Read into a bytearray: the chunks are bracketed in place (_chunks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise InputError(
            path, f"cannot read ({err.strerror})", "check the path/permissions"
        ) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(
                path, "is not a regular file (a FIFO, device or socket)", "pass trace files"
            )
        if st.st_size > limit:
            raise _refuse_size(path, "holds", limit)
        try:
            data = bytearray(st.st_size + 1)  # one more: a file that grew since fstat
            n = f.readinto(data) or 0
            if n == len(data):
                data += f.read(limit + 1 - n)
            else:
                del data[n:]
            return data
        except OSError as err:
            raise InputError(
                path, f"cannot read ({err.strerror})", "check the path/permissions"
            ) from None


def _inflate(path: Path, data: bytes, limit: int) -> bytes | bytearray:
    """Gunzip `data` with the inflated size bounded while it streams (analysis.trace.inflate:
    the size cap and the ratio cap), after a first look that it holds JSON at all."""
    try:
        head = zlib.decompressobj(wbits=31).decompress(data, 1 << 16)
    except zlib.error:
        head = b"{"  # let inflate_capped name the corruption
    if head.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] not in (b"{", b"["):
        raise InputError(path, "is a gzip that holds no JSON", "pass Kineto traces")
    fix = f"raise it with {MAX_TRACE_BYTES_ENV}=<bytes> if this trace is genuine"
    return inflate_capped(path, data, limit, fix)


def read_trace_bytes(path: Path) -> bytearray:
    """The JSON bytes of the trace `path` (gunzipped when it is a gzip, whatever its suffix),
    under the size cap and the ratio cap; InputError naming the file otherwise."""
    limit = max_trace_bytes()
    data = _read_regular(path, limit)
    if data[:2] == b"\x1f\x8b":  # gzip magic: trust the content, not the suffix
        return _inflate(path, data, limit)
    return data
