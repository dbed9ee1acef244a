"""Read one Kineto trace (`.json` or `.json.gz`) into typed events, decoding only what we use.

The top level is decoded first with `traceEvents` kept raw; the events are then decoded by msgspec
in ~512 KiB chunks (split between two events) into a Struct of the needed fields (ph, cat, name,
tid, ts, dur) and of the `args` fields analysis reads (kernels, runtime launches, collectives,
`[memory]` events), all in one pass over the JSON. The caller reduces each chunk to numpy columns
before the next is decoded, so only one chunk of event objects is ever alive. An event of the
wrong shape (`"ts": "abc"`, `"tid": [1]`, `"dur": null`, not an object at all) fails its chunk's
typed decode; only that chunk is then decoded event by event, and each such event becomes an
`IMPOSSIBLE` placeholder that classify drops and counts like an event with impossible times: the
rest of the file is analysed. An `args` value of the wrong type costs only its field group
(`_lenient_args`), never the event. Rank and world size come from `distributedInfo` (parsed as
JSON, so spacing does not matter), else from the file name (`rank<N>`, `rank-<N>`, `worker<N>`).
Gzip is inflated with ISA-L (`isal`, about twice zlib's speed) where it is installed."""

from __future__ import annotations

import math
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from analysis.errors import AnalysisError
from analysis.trace.timebase import MAX_SPAN_US, median_base, needs_exact, rebase

try:  # ISA-L inflates about twice as fast as zlib, with zlib's interface
    from isal import isal_zlib as _zlib

    _INFLATE_ERRORS: tuple[type[Exception], ...] = (zlib.error, _zlib.error)
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the fallback
    _zlib = zlib
    _INFLATE_ERRORS = (zlib.error,)

__all__ = [
    "CHUNK_BYTES",
    "ChunkSplitError",
    "Args",
    "Event",
    "IMPOSSIBLE",
    "LoadedTrace",
    "MAX_SPAN_US",
    "MAX_TRACE_BYTES",
    "MAX_TRACE_BYTES_ENV",
    "BAD_MEMORY",
    "decode_list",
    "parse_args",
    "load_trace",
    "max_trace_bytes",
    "rank_from_name",
]


class Args(msgspec.Struct, gc=False):
    """The `args` fields analysis reads: kernels, launches, collectives and `[memory]` events.
    Decoded with the event itself (one pass over the JSON); the two list-valued fields stay raw
    JSON, decoded only for the collective calls that need them (`decode_list`)."""

    correlation: int | None = None
    external_id: int | None = msgspec.field(default=None, name="External id")
    # tb-profiler's own test traces spell it in lower case on kernels.
    external_id_lc: int | None = msgspec.field(default=None, name="external id")
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    dtype: str | None = None
    group_size: int | None = msgspec.field(default=None, name="Group size")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    # [memory] events (analysis.trace.memory)
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    nbytes: int | None = msgspec.field(default=None, name="Bytes")
    device_type: int | None = msgspec.field(default=None, name="Device Type")
    device_id: int | None = msgspec.field(default=None, name="Device Id")


class Event(msgspec.Struct, gc=False):
    """One trace event with its `args` decoded (None when absent). `ts` is as written (µs);
    the loader hands each chunk's times rebased in a separate array (timebase.py): µs relative
    to the trace's base (`LoadedTrace.ts_base_us`), exact to 1 ns; NaN when absent or
    implausible."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    tid: int | str = 0  # `pid` is never used: not decoding it saves memory
    # NaN when absent: an event without a time is dropped by classify, never taken as 0.
    ts: float = math.nan
    dur: float = math.nan
    args: Args | None = None


class _RawEvent(msgspec.Struct, gc=False):
    """An event whose `args` did not decode as `Args` (an odd value type): decoded leniently."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    tid: int | str = 0
    ts: float = math.nan
    dur: float = math.nan
    args: msgspec.Raw = msgspec.Raw(b"")


class _Collective(msgspec.Struct, gc=False):
    """The non-memory fields of `Args`, decoded on their own when the whole fails."""

    correlation: int | None = None
    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_lc: int | None = msgspec.field(default=None, name="external id")
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    dtype: str | None = None
    group_size: int | None = msgspec.field(default=None, name="Group size")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")


class _Memory(msgspec.Struct, gc=False):
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    nbytes: int | None = msgspec.field(default=None, name="Bytes")
    device_type: int | None = msgspec.field(default=None, name="Device Type")
    device_id: int | None = msgspec.field(default=None, name="Device Id")


class _Correlation(msgspec.Struct, gc=False):
    """Only the correlation id: a launch keeps it even when its other args are malformed."""

    correlation: int | None = None


class _Trace(msgspec.Struct):
    # Raw: decoded later in chunks, so only one chunk of events is alive at a time.
    traceEvents: msgspec.Raw = msgspec.Raw(b"")  # noqa: N815 (Kineto's field name)
    distributedInfo: msgspec.Raw = msgspec.Raw(b"")  # noqa: N815
    # Raw: a string or a value above int64 costs a warning, not the rank (_base_ns).
    baseTimeNanoseconds: msgspec.Raw = msgspec.Raw(b"")  # noqa: N815
    displayTimeUnit: str | None = None  # noqa: N815
    traceName: str | None = None  # noqa: N815


_DECODER = msgspec.json.Decoder(_Trace)
_EVENTS_DECODER = msgspec.json.Decoder(list[Event])
_EVENT_DECODER = msgspec.json.Decoder(Event)
_RAW_LIST_DECODER = msgspec.json.Decoder(list[msgspec.Raw])
# What an event of the wrong shape becomes: a complete event without a time, which classify
# drops and counts (never analysed, never taken as 0).
IMPOSSIBLE = Event(ph="X")
# The trace size cap (JSON bytes after gunzip), stated in docs §1: ~40x the largest reference
# trace's 54 MB; a 10 GiB bomb of zeros or JSON stops here, not in the decoder.
MAX_TRACE_BYTES = 2 << 30
MAX_TRACE_BYTES_ENV = "DPSCOPE_MAX_TRACE_BYTES"
_EVENT_SPLIT_RE = re.compile(rb"\}\s*,\s*\{")
CHUNK_BYTES = 512 << 10  # ~2k events: cache-friendly, and freed chunks are reused at once
_RAW_EVENT_DECODER = msgspec.json.Decoder(_RawEvent)
_ARGS_DECODER = msgspec.json.Decoder(Args | None)
_COLLECTIVE_DECODER = msgspec.json.Decoder(_Collective)
_MEMORY_DECODER = msgspec.json.Decoder(_Memory)
_CORR_DECODER = msgspec.json.Decoder(_Correlation)
_LIST_DECODER = msgspec.json.Decoder(list)
_RANK_RE = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
# `Total Allocated` of a [memory] event whose memory args do not decode: memory.py's
# plausibility check drops and counts it, as an event with an impossible size.
BAD_MEMORY = -(1 << 62)


def decode_list(raw: msgspec.Raw | None) -> list | None:
    """A raw JSON list field (`Input Dims`, `Input type`) as a list; None when absent or not a list."""
    if not raw:
        return None
    try:
        value = _LIST_DECODER.decode(raw)
    except msgspec.DecodeError:
        return None
    return value


def parse_args(raw: bytes | msgspec.Raw) -> Args | None:
    """Raw `args` JSON as `Args`, an odd value type costing only its field group (None: none)."""
    try:
        return _ARGS_DECODER.decode(raw) if raw else None
    except msgspec.DecodeError:
        return _lenient_args(raw)


def _lenient_args(raw: msgspec.Raw) -> Args | None:
    """`args` whose typed decode failed, field group by field group: an odd value type costs its
    group (the collective fields or the memory fields), never the event; the correlation id is
    kept whenever it alone decodes."""
    if not raw or bytes(raw) == b"null":
        return None
    fields: dict = {}
    try:
        fields.update(msgspec.structs.asdict(_COLLECTIVE_DECODER.decode(raw)))
    except msgspec.DecodeError:
        try:
            fields["correlation"] = _CORR_DECODER.decode(raw).correlation
        except msgspec.DecodeError:
            pass
    try:
        fields.update(msgspec.structs.asdict(_MEMORY_DECODER.decode(raw)))
    except msgspec.DecodeError:
        fields["total_allocated"] = BAD_MEMORY
    return Args(**fields)


def rank_from_name(path: Path) -> int | None:
    """Rank parsed from a file name such as `rank3.123.pt.trace.json.gz` or `worker1...`."""
    match = _RANK_RE.search(path.name)
    return int(match.group(1)) if match else None


class ChunkSplitError(Exception):
    """A chunk boundary fell inside an event (never seen in Kineto output): decode in one piece."""


def _one_event(raw: msgspec.Raw) -> Event:
    try:
        return _EVENT_DECODER.decode(raw)
    except msgspec.DecodeError:
        pass
    try:
        e = _RAW_EVENT_DECODER.decode(raw)
    except msgspec.DecodeError:
        return IMPOSSIBLE
    return Event(e.ph, e.cat, e.name, e.tid, e.ts, e.dur, _lenient_args(e.args))


def _events(buf: bytes | memoryview) -> list[Event]:
    """A JSON array of events as `Event`s, an event of the wrong shape as IMPOSSIBLE. The typed
    decode of the whole array is the fast path; only an array it refuses is decoded per event.
    Raises msgspec.DecodeError when `buf` is not a JSON array at all."""
    try:
        return _EVENTS_DECODER.decode(buf)
    except msgspec.DecodeError:
        return [_one_event(e) for e in _RAW_LIST_DECODER.decode(buf)]


def _chunks(raw: memoryview, size: int) -> Iterator[bytes]:
    """The `traceEvents` array in pieces split between two events (`}, {`), each a JSON array."""
    n = len(raw)
    lo = 1  # after the opening bracket
    while lo < n - 1:
        match = _EVENT_SPLIT_RE.search(raw, lo + size) if lo + size < n - 1 else None
        hi = match.start() + 1 if match else n - 1  # up to and including this event's "}"
        yield b"".join((b"[", raw[lo:hi], b"]"))
        lo = match.end() - 1 if match else n  # at the next event's "{"


@dataclass
class LoadedTrace:
    """A decoded trace header; `event_chunks()` yields its events a chunk at a time."""

    path: Path
    raw_events: memoryview
    rank: int | None
    world_size: int | None
    rank_source: str  # "distributedInfo", "file name" or "none"
    backend: str | None
    base_time_ns: int  # baseTimeNanoseconds, 0 when absent or not an integer
    warnings: list[str] = field(default_factory=list)  # header values ignored as impossible
    # Every event's `ts` is relative to this (integer µs): the first chunk's median `ts`.
    ts_base_us: int | None = None
    exact_ts: bool = False  # decode `ts` as Decimal too (timebase.needs_exact)

    def origin_ns(self, origin_us: float) -> int:
        """The absolute time (ns, exact integer) of `origin_us`, a time relative to the base."""
        return self.base_time_ns + 1000 * (self.ts_base_us or 0) + round(origin_us * 1000)

    def _pass(
        self, buffers: Iterator[bytes | memoryview], *, split: bool
    ) -> Iterator[tuple[list[Event], np.ndarray]]:
        """Decode each buffer: (events, their rebased times); a chunked pass (`split`) whose
        piece is not valid JSON raises ChunkSplitError, a whole pass that fails is one
        AnalysisError naming the file."""
        for buf in buffers:
            if split:
                try:
                    events = _events(buf)
                except msgspec.DecodeError:  # not valid JSON: the split fell inside a string
                    raise ChunkSplitError from None
            else:
                events = _decode(_events, self.path, buf)
            if self.ts_base_us is None:
                self.ts_base_us = median_base([e.ts for e in events])
                self.exact_ts = needs_exact(events, buf)
            yield events, rebase(events, buf, self.ts_base_us, exact=self.exact_ts)

    def event_chunks(
        self, *, size: int = CHUNK_BYTES
    ) -> Iterator[Iterator[tuple[list[Event], np.ndarray]]]:
        """Yields one chunked pass over the events; if a chunk boundary turns out to be invalid,
        yields a second pass decoding everything at once (the consumer restarts on it)."""
        raw = self.raw_events
        if raw.nbytes < 2 or bytes(raw[:1]) != b"[" or bytes(raw[-1:]) != b"]":
            raise AnalysisError(
                self.path, "`traceEvents` is not a list", "this is not a torch.profiler trace"
            )
        yield self._pass(_chunks(raw, size), split=True)
        yield self._pass(iter([raw]), split=False)


def _decode(decode: Callable, path: Path, raw: bytes | memoryview):
    """`decode(raw)`, with a decode failure as one line naming the file."""
    try:
        return decode(raw)
    except msgspec.DecodeError as err:
        raise AnalysisError(
            path,
            f"not a Kineto JSON trace ({err})",
            "pass the .pt.trace.json(.gz) files torch.profiler writes",
        ) from None


def max_trace_bytes() -> int:
    """The cap on a trace's size (bytes of JSON, after gunzip): `DPSCOPE_MAX_TRACE_BYTES`, else
    MAX_TRACE_BYTES. A file or an inflated gzip beyond it is refused (a decompression bomb)."""
    text = os.environ.get(MAX_TRACE_BYTES_ENV)
    if text is None:
        return MAX_TRACE_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise AnalysisError(
            MAX_TRACE_BYTES_ENV,
            f"{MAX_TRACE_BYTES_ENV}={text[:40]!r} is not a positive number of bytes",
            f"set {MAX_TRACE_BYTES_ENV} to a byte count, e.g. 8589934592, or unset it",
        )
    return value


def _refuse_size(path: Path, what: str, limit: int) -> AnalysisError:
    return AnalysisError(
        path,
        f"{what} more than {limit:,} bytes (the trace size cap)",
        f"raise it with {MAX_TRACE_BYTES_ENV}=<bytes> if this trace is genuine",
    )


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes; opened non-blocking, so a
    FIFO or a device is refused at once instead of hanging."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise AnalysisError(
            path, f"cannot read ({err.strerror})", "check the path/permissions"
        ) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise AnalysisError(
                path, "is not a regular file (a FIFO, device or socket)", "pass trace files"
            )
        if st.st_size > limit:
            raise _refuse_size(path, "holds", limit)
        try:
            return f.read(limit + 1)
        except OSError as err:
            raise AnalysisError(
                path, f"cannot read ({err.strerror})", "check the path/permissions"
            ) from None


def _inflate(path: Path, data: bytes, limit: int) -> bytes:
    """Gunzip `data` with the inflated size capped at `limit`; memory stays within the cap
    (plus zlib's block buffers) whatever the gzip header or trailer claims."""
    try:
        head = _zlib.decompressobj(wbits=31).decompress(data, 1 << 16)
        if head.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] not in (b"{", b"["):
            raise AnalysisError(path, "is a gzip that holds no JSON", "pass Kineto traces")
        parts, rest, total = [], data, 0
        while rest:  # one pass per gzip member (Kineto writes one)
            d = _zlib.decompressobj(wbits=31)
            parts.append(d.decompress(rest, limit + 1 - total))
            total += len(parts[-1])
            if total > limit or d.unconsumed_tail:
                raise _refuse_size(path, "inflates to", limit)
            if not d.eof:
                raise EOFError
            rest = d.unused_data
        return parts[0] if len(parts) == 1 else b"".join(parts)
    except (EOFError, *_INFLATE_ERRORS):
        raise AnalysisError(
            path, "truncated or corrupt gzip", "the trace was cut off while writing; re-profile"
        ) from None


def _read_bytes(path: Path) -> bytes:
    limit = max_trace_bytes()
    data = _read_regular(path, limit)
    if data[:2] == b"\x1f\x8b":  # gzip magic: trust the content, not the suffix
        return _inflate(path, data, limit)
    return data


# A `\uD800`-`\uDFFF` escape that is not half of a pair, or one UTF-8-encoded (invalid UTF-8):
# msgspec refuses both, which would cost the whole file.
_LONE_SURROGATE_RE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|\xed[\xa0-\xbf][\x80-\xbf]"
)


def _repair_surrogates(data: bytes) -> tuple[bytes, int]:
    """`data` with each lone surrogate (escaped or raw) as U+FFFD, and how many there were."""
    return _LONE_SURROGATE_RE.subn(
        lambda m: b"\\ufffd" if m.group().startswith(b"\\") else "\ufffd".encode(), data
    )


def _count(value: object) -> int | None:
    """`value` if it is a non-negative int (JSON `true` is not a rank), else None."""
    return value if type(value) is int and value >= 0 else None


def load_trace(path: Path) -> LoadedTrace:
    """Decode `path`; raises AnalysisError (one line) when it is not a usable Kineto trace."""
    path = Path(path)
    data = _read_bytes(path)
    warnings: list[str] = []
    try:
        trace = _DECODER.decode(data)
    except msgspec.DecodeError:  # a lone surrogate costs its characters, not the rank
        data, fixed = _repair_surrogates(data)
        trace = _decode(_DECODER.decode, path, data)
        warnings.append(f"{path}: {fixed} lone UTF-16 surrogate(s) in strings replaced by U+FFFD")
    if not trace.traceEvents:
        raise AnalysisError(path, "no `traceEvents` list", "this is not a torch.profiler trace")
    rank = world = backend = None
    source = "none"
    if trace.distributedInfo:
        try:
            info = msgspec.json.decode(trace.distributedInfo)
        except msgspec.DecodeError:
            info = None
        bad = isinstance(info, dict) and "rank" in info and _count(info["rank"]) is None
        if bad:
            warnings.append(
                f"{path}: distributedInfo.rank {repr(info['rank'])[:40]} is not a rank"
                " (a non-negative integer) — ignored; the rank comes from the file name if any"
            )
        if isinstance(info, dict) and _count(info.get("rank")) is not None:
            rank, source = info["rank"], "distributedInfo"
            world = _count(info.get("world_size")) or None
            backend = info.get("backend") if isinstance(info.get("backend"), str) else None
    if rank is None and (rank := rank_from_name(path)) is not None:
        source = "file name"
    base_ns = _base_ns(trace.baseTimeNanoseconds, path, warnings)
    raw = memoryview(trace.traceEvents).cast("B")
    return LoadedTrace(path, raw.toreadonly(), rank, world, source, backend, base_ns, warnings)


def _base_ns(raw: msgspec.Raw, path: Path, warnings: list[str]) -> int:
    """`baseTimeNanoseconds` when it is an integer in [0, 2⁶³); anything else (a string, a
    float, a value above int64) is ignored with a warning: it only shifts this rank's clock."""
    if not raw:
        return 0
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        value = None
    if type(value) is int and 0 <= value < 1 << 63:
        return value
    warnings.append(
        f"{path}: baseTimeNanoseconds {bytes(raw)[:40]!r} is not an integer in [0, 2^63) —"
        " ignored (taken as 0); cross-rank alignment of this rank may be off"
    )
    return 0
