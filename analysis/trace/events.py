"""A trace event as analysis reads it, decoded by msgspec with the `args` fields it uses, and the
lenient fallbacks that keep a file analysable when some events or values have the wrong shape.

`Event` carries `ph`, `cat`, `name`, `tid`, `ts`, `dur` and `args` (an `Args` of the fields that
kernels, launches, collectives and `[memory]` events carry), decoded in one pass over a chunk
(loader.py). A chunk the typed decode refuses is decoded event by event (`decode_events`): an
event of the wrong shape becomes `IMPOSSIBLE` (dropped and counted by classify), and an `args`
value of the wrong type costs only its field group (`parse_args`), never the event.
"""

from __future__ import annotations

import math

import msgspec

__all__ = [
    "BAD_MEMORY",
    "IMPOSSIBLE",
    "Args",
    "Event",
    "decode_events",
    "decode_list",
    "parse_args",
]


class _Collective(msgspec.Struct, gc=False):
    """The non-memory fields of `Args` (its base), decoded on their own when the whole fails."""

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


class Args(_Collective, gc=False):
    """The `args` fields analysis reads: kernels, launches, collectives and `[memory]` events.
    Decoded with the event itself (one pass over the JSON); the two list-valued fields stay raw
    JSON, decoded only for the collective calls that need them (`decode_list`)."""

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


class _Memory(msgspec.Struct, gc=False):
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    nbytes: int | None = msgspec.field(default=None, name="Bytes")
    device_type: int | None = msgspec.field(default=None, name="Device Type")
    device_id: int | None = msgspec.field(default=None, name="Device Id")


class _Correlation(msgspec.Struct, gc=False):
    """Only the correlation id: a launch keeps it even when its other args are malformed."""

    correlation: int | None = None


_EVENTS_DECODER = msgspec.json.Decoder(list[Event])
_EVENT_DECODER = msgspec.json.Decoder(Event)
_RAW_LIST_DECODER = msgspec.json.Decoder(list[msgspec.Raw])
# What an event of the wrong shape becomes: a complete event without a time, which classify
# drops and counts (never analysed, never taken as 0).
IMPOSSIBLE = Event(ph="X")
_RAW_EVENT_DECODER = msgspec.json.Decoder(_RawEvent)
_ARGS_DECODER = msgspec.json.Decoder(Args | None)
_COLLECTIVE_DECODER = msgspec.json.Decoder(_Collective)
_MEMORY_DECODER = msgspec.json.Decoder(_Memory)
_CORR_DECODER = msgspec.json.Decoder(_Correlation)
_LIST_DECODER = msgspec.json.Decoder(list)
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


def decode_events(buf: bytes | memoryview) -> list[Event]:
    """A JSON array of events as `Event`s, an event of the wrong shape as IMPOSSIBLE. The typed
    decode of the whole array is the fast path; only an array it refuses is decoded per event.
    Raises msgspec.DecodeError when `buf` is not a JSON array at all."""
    try:
        return _EVENTS_DECODER.decode(buf)
    except msgspec.DecodeError:
        return [_one_event(e) for e in _RAW_LIST_DECODER.decode(buf)]
