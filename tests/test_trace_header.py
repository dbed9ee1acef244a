"""The loader decodes only the bytes around `traceEvents` when it can find them
(loader._split_header), and the whole file otherwise. Whatever the layout, a trace gives exactly
what decoding the whole file gives: the same summary, the same warnings, or the same one-line
error. The reference is the same bytes behind a 1 MiB header field, where the array's start is
past the loader's search and the whole file is decoded."""

from __future__ import annotations

import contextlib
import gzip
import json
import re
from pathlib import Path

import msgspec
import numpy as np
import pytest

from analysis.trace.classify import classify
from analysis.trace.loader import HEADER_SCAN_BYTES, TAIL_SCAN_BYTES, load_trace
from analysis.trace.rank import summarize_file
from profiler.runfolder.errors import InputError
from tests.hostile_common import ddp_traces  # noqa: F401  (fixture)

_END = b"\n  ]"  # how Kineto closes the array (json.dumps(indent=2) writes the same)


def _reversed_events(text: bytes) -> bytes:
    return json.dumps(json.loads(text)["traceEvents"][::-1], indent=2).encode()


def _tail(edit: bytes) -> callable:
    """Put `edit` (text of more top-level fields) right after the events' array."""
    return lambda text: text.replace(_END + b",", _END + b"," + edit, 1)


# How a layout is decoded: HEADER, the header around the array only, and the events' pass
# holds; RECHECK, the header only at first, then the whole file once the events' pass fails;
# WHOLE, the whole file from the start.
HEADER, RECHECK, WHOLE = "header", "recheck", "whole"
# name -> (edit of the trace's JSON text, how it is decoded)
LAYOUTS = {
    "as Kineto writes it": (lambda text: text, HEADER),
    "log lines after the array, as newer Kineto writes them": (
        _tail(b' "INFO": ["a.cpp:976] Enabling GPU tracing", "b.cpp:1220] 1 iterations"],'),
        HEADER,
    ),
    "`]` and the key in strings after the array": (
        _tail(b' "x": "] \\"traceEvents\\": [ ]]", "y": ["]"],'),
        HEADER,
    ),
    "a nested `traceEvents` key before the real one": (
        lambda text: text.replace(b"{", b'{"meta": {"traceEvents": [1]}, ', 1),
        WHOLE,
    ),
    # The file with `[]` spliced at the `}]` in "s" reads the next key as 3,000 nested arrays.
    "a string after the array that reads as deep nesting once cut": (
        _tail(b' "s": "}],", ":' + b"[" * 3000 + b"]" * 3000 + b'": 1,'),
        HEADER,
    ),
    "more `}]` after the array than the loader tries": (
        _tail(b' "x": "' + b"}]" * 40 + b'",'),
        WHOLE,
    ),
    # The array's end is taken at the second one's `]`: the events' pass refuses that piece.
    "a second `traceEvents` after the first": (_tail(b' "traceEvents": [],'), RECHECK),
    # The span ends at the `]` of "x": the last `traceEvents`, a number, is what the whole file
    # holds, and it is refused as not a list.
    "a second `traceEvents` that is not a list": (
        _tail(b' "traceEvents": 5, "x": [{}],'),
        RECHECK,
    ),
    # The last of two keys counts (msgspec), and the first one's events come first: the pass
    # over the wrong span refuses it, and the right span is chunked afresh (its own time base).
    "an array of the events reversed before the real one": (
        lambda text: text.replace(b"{", b'{"traceEvents": ' + _reversed_events(text) + b", ", 1),
        RECHECK,
    ),
    # Found by its key's text, `"traceEvents":`, which ends the key `x"traceEvents`: the file
    # with `[]` there decodes, but its `traceEvents` is the empty array after the events.
    "the events under another key, an empty `traceEvents` after": (
        lambda text: _tail(b' "traceEvents": [],')(
            text.replace(b'"traceEvents":', b'"x\\"traceEvents":', 1)
        ),
        WHOLE,
    ),
    "a lone surrogate in an event's name": (  # the pass that meets it decodes the whole file
        lambda text: text.replace(b'"name": "ProfilerStep#', b'"name": "\\ud800ProfilerStep#', 1),
        RECHECK,
    ),
    "a trace cut inside its events": (lambda text: text[: len(text) // 2], WHOLE),
    "bytes after the closing brace": (lambda text: text + b" x", WHOLE),
    "the array's end missing": (lambda text: text.replace(_END, b"", 1), WHOLE),
}


def _how(path) -> str:
    """How the loader decoded `path` (HEADER, RECHECK or WHOLE)."""
    try:
        loaded = load_trace(path)
    except InputError:
        return WHOLE
    if loaded.checked:
        return WHOLE
    with contextlib.suppress(InputError):
        classify(loaded.event_chunks())
    return RECHECK if loaded.checked else HEADER


def _outcome(path) -> str:
    """The summary (or the one-line error) as text."""
    try:
        return msgspec.json.encode(summarize_file(path), enc_hook=np.ndarray.tolist).decode()
    except InputError as err:
        return re.sub(r"byte \d+", "byte N", str(err))


def _text(trace: Path, small: bool) -> bytes:
    """The trace as JSON text laid out as Kineto writes it; `small`: only the first step's first
    80 events, so the whole file is within the loader's tail search (TAIL_SCAN_BYTES)."""
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    if small:
        step = next(e for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep"))
        lo, hi = step["ts"], step["ts"] + step["dur"]
        doc["traceEvents"] = [e for e in doc["traceEvents"] if lo <= e.get("ts", -1) <= hi][:80]
    text = json.dumps(doc, indent=2).encode()
    assert _END + b",\n" in text and (len(text) < TAIL_SCAN_BYTES) is small
    return text


@pytest.mark.parametrize("small", [False, True], ids=["whole trace", "small trace"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_trace_gives_what_decoding_the_whole_file_gives(layout, small, tmp_path, ddp_traces):  # noqa: F811
    edit, how = LAYOUTS[layout]
    edited = edit(_text(ddp_traces[1], small))
    pad = b'{"pad": "' + b"x" * HEADER_SCAN_BYTES + b'", '
    got_path, ref_path = tmp_path / "rank1.got.json", tmp_path / "rank1.ref.json"
    got_path.write_bytes(edited)
    ref_path.write_bytes(pad + edited[1:])
    got, want = _outcome(got_path), _outcome(ref_path)
    assert got.replace("rank1.got", "F") == want.replace("rank1.ref", "F")
    assert (_how(got_path), _how(ref_path)) == (how, WHOLE)
    if layout == "a lone surrogate in an event's name":
        assert "lone UTF-16 surrogate" in got
    elif how == HEADER:
        assert '"steps":' in got and '"steps":0' not in got  # a summary with steps, not an error
