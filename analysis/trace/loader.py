"""Read one Kineto trace (`.json` or `.json.gz`) into typed events, decoding only what we use.

The top level is decoded first with `traceEvents` kept raw (only the bytes around the array,
where they can be found: `_split_header`); the events are then decoded by msgspec
in ~512 KiB chunks (split between two events, bracketed in place in the file's buffer, never
copied out) into a Struct of the needed fields (ph, cat, name,
tid, ts, dur) and of the `args` fields analysis reads (kernels, runtime launches, collectives,
`[memory]` events), all in one pass over the JSON. The caller reduces each chunk to numpy columns
before the next is decoded, so only one chunk of event objects is ever alive. An event of the
wrong shape (`"ts": "abc"`, `"tid": [1]`, `"dur": null`, not an object at all) fails its chunk's
typed decode; only that chunk is then decoded event by event, and each such event becomes an
`IMPOSSIBLE` placeholder that classify drops and counts like an event with impossible times: the
rest of the file is analysed. An `args` value of the wrong type costs only its field group
(events.py), never the event. Rank and world size come from `distributedInfo` (parsed as
JSON, so spacing does not matter), else from the file name (`rank<N>`, `rank-<N>`, `worker<N>`).
The file is read, and gunzipped, under the size caps of analysis.trace.inflate."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from analysis.trace.events import Event, decode_events
from analysis.trace.inflate import read_trace_bytes
from analysis.trace.timebase import MAX_SPAN_US, median_base, needs_exact, rebase
from profiler.runfolder.clockprobe import CLOCK_PROBE_KEY, ClockProbe, decode_clock_probe
from profiler.runfolder.errors import InputError

__all__ = [
    "CHUNK_BYTES",
    "ChunkSplitError",
    "LoadedTrace",
    "MAX_SPAN_US",
    "load_trace",
    "rank_from_name",
]


class _Trace(msgspec.Struct):
    # Raw: decoded later in chunks, so only one chunk of events is alive at a time.
    traceEvents: msgspec.Raw = msgspec.Raw(b"")  # noqa: N815 (Kineto's field name)
    distributedInfo: msgspec.Raw = msgspec.Raw(b"")  # noqa: N815
    # Raw: a string or a value above int64 costs a warning, not the rank (_base_ns).
    baseTimeNanoseconds: msgspec.Raw = msgspec.Raw(b"")  # noqa: N815
    displayTimeUnit: str | None = None  # noqa: N815
    traceName: str | None = None  # noqa: N815
    host_name: msgspec.Raw = msgspec.Raw(b"")  # Raw: a bad one costs the host, not the rank
    dpscope_clock_probe: msgspec.Raw = msgspec.Raw(b"")  # CLOCK_PROBE_KEY; a bad one: ignored


_DECODER = msgspec.json.Decoder(_Trace)
_EVENT_SPLIT_RE = re.compile(rb"\}\s*,\s*\{")
CHUNK_BYTES = 512 << 10  # ~2k events: cache-friendly, and freed chunks are reused at once
# Where _split_header looks for the array's ends: Kineto writes its header (devices, metadata)
# first, a few KiB, and after the array `traceName` and a few log lines; a file laid out
# otherwise is decoded whole, as before.
_EVENTS_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*(?=\[)')
HEADER_SCAN_BYTES = 1 << 20
TAIL_SCAN_BYTES = 1 << 20
_TAIL_TRIES = 16  # decodes of the header around a candidate end
_TAIL_LOOKS = 4096  # `]`s looked at: a tail of `]`s costs ~2 ms, not a scan of the whole MiB
_RANK_RE = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


def rank_from_name(path: Path) -> int | None:
    """Rank parsed from a file name such as `rank3.123.pt.trace.json.gz` or `worker1...`."""
    match = _RANK_RE.search(path.name)
    return int(match.group(1)) if match else None


class ChunkSplitError(Exception):
    """A chunk boundary fell inside an event (never seen in Kineto output): decode in one piece."""


def _chunks(raw: memoryview, size: int) -> Iterator[memoryview]:
    """The `traceEvents` array in pieces split between two events (`}, {`), each a JSON array.

    In place, without copying: `raw` is writable, and each piece is its own bytes with the byte
    before its first event written `[` and the byte after its last `]` (a separator's comma or
    space; the array's own brackets at its ends). Both are put back when the next piece is asked
    for or the generator closes, so at most one piece is ever written; copying each piece out
    instead costs fresh memory for the whole trace (~30 ms of page faults per 54 MB)."""
    n = len(raw)
    lo = 1  # after the opening bracket
    while lo < n - 1:
        match = _EVENT_SPLIT_RE.search(raw, lo + size) if lo + size < n - 1 else None
        hi = match.start() + 1 if match else n - 1  # just after this event's "}"
        before, after = raw[lo - 1], raw[hi]
        raw[lo - 1], raw[hi] = 0x5B, 0x5D  # "[" and "]"
        try:
            yield raw[lo - 1 : hi + 1]
        finally:
            raw[lo - 1], raw[hi] = before, after
        lo = match.end() - 1 if match else n  # at the next event's "{"


@dataclass
class LoadedTrace:
    """A decoded trace header; `event_chunks()` yields its events a chunk at a time. Read the
    header fields after a pass has completed: a header-only load (`checked` False) whose pass
    fails replaces them with the whole file's."""

    path: Path
    raw_events: memoryview  # writable: event_chunks() brackets each chunk in place (_chunks)
    rank: int | None
    world_size: int | None
    rank_source: str  # "distributedInfo", "file name" or "none"
    backend: str | None
    base_time_ns: int  # baseTimeNanoseconds, 0 when absent or not an integer
    warnings: list[str] = field(default_factory=list)  # header values ignored as impossible
    host: str | None = None  # Kineto's `host_name`: ranks on one host share one clock
    clock_probe: ClockProbe | None = None  # the rank's clock against rank 0's (clockprobe)
    # Every event's `ts` is relative to this (integer µs): the first chunk's median `ts`.
    ts_base_us: int | None = None
    exact_ts: bool = False  # decode `ts` as Decimal too (timebase.needs_exact)
    # False when only the header around `traceEvents` was decoded (_split_header): the events
    # are then validated by the pass that decodes them, and a pass that fails first decodes the
    # whole file, replacing every field here (the header included) with what a load of the
    # whole file gives (lone surrogates repaired, with a warning; or one-line refusal).
    checked: bool = True

    def origin_ns(self, origin_us: float) -> int:
        """The absolute time (ns, exact integer) of `origin_us`, a time relative to the base."""
        return self.base_time_ns + 1000 * (self.ts_base_us or 0) + round(origin_us * 1000)

    def _pass(
        self, buffers: Iterator[memoryview], *, split: bool
    ) -> Iterator[tuple[list[Event], np.ndarray]]:
        """Decode each buffer: (events, their rebased times); a chunked pass (`split`) whose
        piece is not valid JSON raises ChunkSplitError, a whole pass that fails is one
        InputError naming the file. Leaving (an error included) closes `buffers` first, so the
        bytes _chunks wrote are back before anything else reads them."""
        with contextlib.closing(buffers):
            for buf in buffers:
                if split:
                    try:
                        events = decode_events(buf)
                    except msgspec.DecodeError:  # not valid JSON: the split fell inside a string
                        raise ChunkSplitError from None
                else:
                    events = _decode(decode_events, self.path, buf)
                if self.ts_base_us is None:
                    self.ts_base_us = median_base([e.ts for e in events])
                    self.exact_ts = needs_exact(events, buf)
                yield events, rebase(events, buf, self.ts_base_us, exact=self.exact_ts)

    def event_chunks(
        self, *, size: int = CHUNK_BYTES
    ) -> Iterator[Iterator[tuple[list[Event], np.ndarray]]]:
        """Yields one chunked pass over the events; if a chunk boundary turns out to be invalid,
        yields a second pass decoding everything at once (the consumer restarts on it). When
        only the header was decoded (`checked` False), a failed first pass is followed by the
        passes of a load that decoded the whole file: the whole file is decoded (repaired, or
        refused with one line), then chunked again, then decoded at once."""
        raw = self._events_list()
        yield self._pass(_chunks(raw, size), split=True)
        if not self.checked:  # from here on, everything as a load that decoded the whole file
            vars(self).update(vars(_load_whole(self.path, raw.obj)))
            raw = self._events_list()
            yield self._pass(_chunks(raw, size), split=True)
        yield self._pass((whole for whole in (raw,)), split=False)

    def _events_list(self) -> memoryview:
        """`raw_events`, or one line when it is not a JSON array (checked again once the whole
        file is decoded: its `traceEvents` may be another key's value than the header's span)."""
        raw = self.raw_events
        if raw.nbytes < 2 or bytes(raw[:1]) != b"[" or bytes(raw[-1:]) != b"]":
            raise InputError(
                self.path, "`traceEvents` is not a list", "this is not a torch.profiler trace"
            )
        return raw


def _decode(decode: Callable, path: Path, raw: bytes | memoryview):
    """`decode(raw)`, with a decode failure as one line naming the file."""
    try:
        return decode(raw)
    except msgspec.DecodeError as err:
        raise InputError(
            path,
            f"not a Kineto JSON trace ({err})",
            "pass the .pt.trace.json(.gz) files torch.profiler writes",
        ) from None


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


def _decode_whole(path: Path, data: bytearray, warnings: list[str]) -> tuple[_Trace, bytearray]:
    """The whole file's top level, and the buffer it was decoded from: `data`, or a repaired
    copy when it holds lone surrogates (each costs its characters, with a warning)."""
    try:
        return _DECODER.decode(data), data
    except msgspec.DecodeError:
        pass
    repaired, fixed = _repair_surrogates(data)
    data = bytearray(repaired)
    del repaired  # two copies of the trace at most
    trace = _decode(_DECODER.decode, path, data)
    warnings.append(f"{path}: {fixed} lone UTF-16 surrogate(s) in strings replaced by U+FFFD")
    return trace, data


def _split_header(data: bytearray) -> tuple[_Trace, memoryview] | None:
    """The top level decoded from the bytes around `traceEvents` only, and the array's view; None
    when they cannot be found (the caller then decodes the whole file). The array opens after
    the first `"traceEvents":` of the head; its end is tried at each of the last `]`s that
    follow a `}` (an event's end) or the `[`, past what newer Kineto writes after the events
    (`"INFO": [...]` log lines). A try holds only when the file with `[]` in place of the
    array decodes with `traceEvents` exactly there: then the whole file is valid JSON with the
    same top level as soon as the array itself is, which the pass that decodes the events
    checks. Saves decoding 54 MB twice (~33 ms of a trace's ~400)."""
    key = _EVENTS_KEY_RE.search(data, 0, HEADER_SCAN_BYTES)
    if key is None:
        return None
    start, end, tries = key.end(), len(data), 0
    head, floor = bytes(data[:start]), max(start, len(data) - TAIL_SCAN_BYTES)
    for _ in range(_TAIL_LOOKS):
        if tries == _TAIL_TRIES or (end := data.rfind(b"]", floor, end)) <= start:
            return None
        if data[max(start, end - 64) : end].rstrip(b" \t\r\n")[-1:] not in (b"}", b"["):
            continue  # a `]` in a string or another array: not the events' end
        tries += 1
        header = b"".join((head, b"[]", data[end + 1 :]))
        try:
            trace = _DECODER.decode(header)
        except (msgspec.DecodeError, RecursionError):  # a splice inside a string reads it as JSON
            continue
        if len(trace.traceEvents) == 2 and _offset(header, trace.traceEvents) == start:
            return trace, memoryview(data)[start : end + 1]
    return None


def load_trace(path: Path) -> LoadedTrace:
    """Decode `path`; raises InputError (one line) when it is not a usable Kineto trace."""
    path = Path(path)
    data = read_trace_bytes(path)
    if split := _split_header(data):
        return _loaded(path, *split, [], checked=False)
    return _load_whole(path, data)


def _load_whole(path: Path, data: bytearray) -> LoadedTrace:
    """The trace from its whole file decoded once (repaired when it holds lone surrogates)."""
    warnings: list[str] = []
    trace, data = _decode_whole(path, data, warnings)
    if not trace.traceEvents:
        raise InputError(path, "no `traceEvents` list", "this is not a torch.profiler trace")
    return _loaded(path, trace, _events_view(data, trace.traceEvents), warnings, checked=True)


def _loaded(
    path: Path, trace: _Trace, events: memoryview, warnings: list[str], *, checked: bool
) -> LoadedTrace:
    """The LoadedTrace of a decoded top level: rank, world size and backend from
    `distributedInfo` (else the rank from the file name), base time, host and clock probe."""
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
    return LoadedTrace(
        path, events, rank, world, source, backend, base_ns, warnings, _host(trace),
        _probe(trace.dpscope_clock_probe, path, warnings), checked=checked,
    )  # fmt: skip


def _events_view(data: bytearray, events: msgspec.Raw) -> memoryview:
    """`traceEvents` as a writable view of `data`, the buffer it was decoded from: msgspec's Raw
    points into that buffer, so its offset is the difference of the two addresses. A copy where
    it does not (never seen)."""
    at, size = _offset(data, events), len(events)
    if 0 <= at <= len(data) - size:
        return memoryview(data)[at : at + size]
    return memoryview(bytearray(events))


def _offset(buf: bytes | bytearray, raw: msgspec.Raw) -> int:
    """Where `raw` starts in `buf`, the buffer it was decoded from (the difference of their
    addresses; out of range when msgspec copied it)."""
    view = np.frombuffer(memoryview(raw).cast("B"), np.uint8)
    return view.ctypes.data - np.frombuffer(buf, np.uint8).ctypes.data


def _probe(raw: msgspec.Raw, path: Path, warnings: list[str]) -> ClockProbe | None:
    """The trace's clock probe; one that is not a probe record is ignored with a warning (the
    rank's clock then comes from its collectives alone)."""
    if not raw:
        return None
    if (probe := decode_clock_probe(raw)) is None:
        warnings.append(
            f"{path}: `{CLOCK_PROBE_KEY}` is not a dpscope clock probe — ignored; this rank's "
            "clock offset comes from its collectives alone"
        )
    return probe


def _host(trace: _Trace) -> str | None:
    """Kineto's `host_name` if it is a string of 1-255 characters, else None (no host)."""
    value = msgspec.json.decode(trace.host_name) if trace.host_name else None  # valid JSON
    return value if isinstance(value, str) and 0 < len(value) <= 255 else None


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
