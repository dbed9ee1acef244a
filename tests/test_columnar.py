"""The columnar loader: an `args` value of the wrong JSON type costs only its field group (the
event and the rest of its chunk stay as the clean trace gives them); what an event is, is
decided once per distinct (ph, cat, name); self times by binary lifting equal the stack scan."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis.trace.classify import classify
from analysis.trace.loader import ChunkSplitError, load_trace
from analysis.trace.ops import self_times
from analysis.trace.rank import summarize_file
from analysis.trace.roles import Role, Vocab, role_of


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _trace(extra_args: dict) -> dict:
    return {
        "distributedInfo": {"rank": 0, "world_size": 2},
        "traceEvents": [
            _x("cpu_op", "ProfilerStep#1", 0, 100),
            _x("cpu_op", "ProfilerStep#2", 100, 100),
            _x("cuda_runtime", "cudaLaunchKernel", 10, 1, correlation=1),
            _x("kernel", "gemm", 20, 30, "s7", correlation=1, **extra_args),
            {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 30, "tid": 1,
             "args": {"Total Allocated": 512, "Bytes": 512, "Device Type": 0, **extra_args}},
        ],
    }  # fmt: skip


def _write(tmp_path, name: str, trace: dict):
    path = tmp_path / name
    path.write_text(json.dumps(trace))
    return path


def test_an_odd_args_value_costs_only_its_field_group(tmp_path):
    clean = summarize_file(_write(tmp_path, "rank0.clean.json", _trace({})))
    # `External id` of the wrong type: the kernel keeps its correlation id, so its launch and
    # its step (no orphan); `Device Id` of the wrong type: that [memory] event is dropped, counted
    odd = summarize_file(_write(tmp_path, "rank0.odd.json", _trace({"External id": "x",
                                                                    "Device Id": [0]})))  # fmt: skip
    assert odd.orphan_kernels == clean.orphan_kernels == 0
    assert odd.per_step == clean.per_step and odd.compute_us == clean.compute_us == 30.0
    assert odd.dropped_events == 0 and clean.memory["devices"][0]["events"] == 1
    assert odd.memory["devices"] == [] and "dropped 1 [memory] event" in odd.memory["warnings"][0]


def test_roles_are_decided_once_per_distinct_key(tmp_path):
    path = _write(tmp_path, "rank0.json", _trace({}))
    c = classify(load_trace(path).event_chunks())
    assert len(c.kernels) == 1 and len(c.steps) == 2 and c.kernels.names == ["gemm"]
    vocab = Vocab()
    events = load_trace(path)
    (chunk,) = [e for e, _ in next(events.event_chunks())]
    codes = vocab.encode(chunk + chunk)  # the same five keys twice: five codes
    assert len(vocab) == 5 and codes.tolist()[:5] == codes.tolist()[5:]
    roles = vocab.table("role")[codes[:5]].tolist()
    assert roles == [Role.STEP, Role.STEP, Role.RUNTIME, Role.KERNEL, Role.NONE]
    assert role_of("X", "user_annotation", "gloo:all_reduce") == Role.ANCHOR
    assert role_of("X", "cpu_op", "c10d::allreduce_") == Role.ISSUE


def test_a_chunk_split_inside_a_string_decodes_the_whole_trace_once_its_bytes_are_back(tmp_path):
    """Chunks are bracketed in place (loader._chunks). A name holding `}, {` makes a split fall
    inside a string: that piece is not JSON, and the events are decoded in one piece instead,
    from bytes that must be the file's again (the written brackets put back)."""
    trace = _trace({})
    trace["traceEvents"][2]["name"] = "cudaLaunchKernel" + "}, {" * 40
    path = _write(tmp_path, "rank0.split.json", trace)
    loaded = load_trace(path)
    original = bytes(loaded.raw_events)
    # 64-byte chunks: a split after every event or so, one of them inside that name.
    with pytest.raises(ChunkSplitError):
        list(next(loaded.event_chunks(size=64)))
    assert bytes(loaded.raw_events) == original  # put back as the pass failed
    chunked = classify(load_trace(path).event_chunks(size=64))  # then decoded in one piece
    whole = classify(load_trace(path).event_chunks(size=1 << 20))
    assert chunked.kernels.names == whole.kernels.names == ["gemm"]
    assert chunked.steps.names == whole.steps.names and len(chunked.steps) == 2
    assert np.array_equal(chunked.launch_us, whole.launch_us) and not chunked.orphan.any()
    # The same trace split only between events gives the same result, chunk by chunk.
    trace["traceEvents"][2]["name"] = "cudaLaunchKernel"
    plain = load_trace(_write(tmp_path, "rank0.plain.json", trace))
    passes = plain.event_chunks(size=64)
    assert len(list(next(passes))) == 5  # five chunks, none refused
    assert bytes(plain.raw_events) == json.dumps(trace["traceEvents"]).encode()


def _stack_self_times(start, end, tids):
    """The sequential scan: per thread by start (outer first), pop ended ops, subtract each op's
    overlap from the op on top of the stack."""
    out = (end - start).tolist()
    s, e, t = start.tolist(), end.tolist(), tids.tolist()
    stack, tid = [], None
    for i in np.lexsort((-end, start, tids)).tolist():
        if t[i] != tid:
            stack, tid = [], t[i]
        while stack and e[stack[-1]] <= s[i]:
            stack.pop()
        if stack:
            out[stack[-1]] -= max(0.0, min(e[i], e[stack[-1]]) - s[i])
        stack.append(i)
    return np.maximum(np.asarray(out, dtype=np.float64), 0.0)


def test_self_times_equal_the_stack_scan_bit_for_bit():
    """Nested, partly overlapping, zero-length and tied ops on three threads."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(0, 80))
        start = np.round(rng.uniform(0, 100, n), int(rng.integers(0, 3)))
        dur = np.round(rng.exponential(10, n), int(rng.integers(0, 3))) * (
            rng.uniform(size=n) > 0.1
        )
        tids = rng.integers(0, 3, n)
        want = _stack_self_times(start, start + dur, tids)
        assert self_times(start, start + dur, tids).tobytes() == want.tobytes()
