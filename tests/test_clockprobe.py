"""The clock probe (profiler.runfolder.clockprobe, profiler.clockexchange, analysis/trace/clocks.py):
bounds from timestamp pings, combined with the collectives' bounds on hand-built cases whose
true offsets are known; the exchange's wire protocol over a real socket pair, a stranger without
the token refused; a bad probe in a trace is one warning; the shift hook moves the probe."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from analysis.trace.clocks import estimate_offsets, probe_bounds
from analysis.trace.loader import load_trace
from profiler import clockexchange
from profiler.clockshift import apply_clock_shift, clock_shift_us
from profiler.runfolder.clockprobe import CLOCK_PROBE_KEY, ClockProbe, decode_clock_probe
from tests.test_clocks import hand_built_job


def _probe(low: float, high: float, *, probe_id: str = "w1", pings: int = 32) -> ClockProbe:
    return ClockProbe(
        reference_rank=0, offset_us_low=low, offset_us_high=high, pings=pings, probe_id=probe_id
    )


REF = _probe(0.0, 0.0, pings=0)


def test_the_probe_and_the_collectives_intersect_and_hold_the_truth():
    truth = {0: 0.0, 1: -5000.0}
    offsets, warnings = estimate_offsets(
        hand_built_job(truth), {0: "a", 1: "b"}, {0: REF, 1: _probe(-5012.0, -4991.0)}
    )
    assert warnings == []
    off = offsets[1]
    assert off.source == "probe and collectives" and off.uncertainty_us <= 10.5
    assert abs(off.offset_us - truth[1]) <= off.uncertainty_us


def test_the_probe_alone_aligns_a_host_with_too_few_collectives():
    offsets, warnings = estimate_offsets(
        hand_built_job({0: 0.0, 1: 3000.0}, calls=2),
        {0: "a", 1: "b"},
        {0: REF, 1: _probe(2990.0, 3010.0)},
    )
    assert warnings == []
    assert (offsets[1].offset_us, offsets[1].uncertainty_us) == (3000.0, 10.0)
    assert offsets[1].source == "clock probe"


def test_a_probe_that_disagrees_with_the_collectives_is_dropped_with_one_warning():
    offsets, warnings = estimate_offsets(
        hand_built_job({0: 0.0, 1: 4000.0}), {0: "a", 1: "b"}, {0: REF, 1: _probe(0.0, 20.0)}
    )
    assert offsets[1].source == "collectives"
    assert abs(offsets[1].offset_us - 4000) <= offsets[1].uncertainty_us
    [warning] = warnings
    assert warning.startswith("rank 1 (host b): its clock probe (0.0 to 20.0 µs) and its ")
    assert "disagree — the collectives' bound is used" in warning


def test_probes_of_another_window_are_not_combined():
    probes = {0: REF, 1: _probe(2990.0, 3010.0, probe_id="other job")}
    assert probe_bounds([1], [0], probes) is None
    offsets, warnings = estimate_offsets(
        hand_built_job({0: 0.0, 1: 3000.0}, calls=2), {0: "a", 1: "b"}, probes
    )
    assert offsets[1].offset_us is None
    assert warnings[0] == (
        "rank 1 (host b): its clock probe is not used — the reference rank has none, or of "
        "another window (a different probe_id), or its ranks' probes conflict"
    )
    assert "fewer than 3, and no usable clock probe" in warnings[1]


def test_probes_of_one_host_intersect_and_a_reference_without_rank_0_still_works():
    # Ranks 2 and 3 share host b: both probes bound its one offset.
    probes = {0: REF, 2: _probe(990.0, 1030.0), 3: _probe(970.0, 1010.0)}
    assert probe_bounds([2, 3], [0], probes) == (990.0, 1010.0)
    # Rank 0's trace missing: rank 1 (host a, offset +5 against rank 0) is the reference, so
    # host b's offset against it is (1000 − 5) within the widths of both probes.
    probes = {1: _probe(0.0, 10.0), 2: _probe(990.0, 1030.0)}
    assert probe_bounds([2], [1], probes) == (980.0, 1030.0)
    assert probe_bounds([2], [1], {2: probes[2]}) is None  # the reference rank has no probe


def test_the_exchange_bounds_hold_a_known_skew_and_refuse_a_stranger():
    """Rank 0's side (`serve_one`) against a client that follows the wire protocol with a clock
    reading 2 ms ahead, over a real socket pair: the bounds hold +2,000 µs."""
    token = b"k" * 16
    skew_ns = 2_000_000

    def client(sock: socket.socket, their_token: bytes, out: list) -> None:
        sock.sendall(clockexchange.HELLO.pack(their_token, 1))
        try:
            while (cmd := clockexchange.read_exact(sock, 1, time.monotonic() + 10)) == b"p":
                t2 = time.time_ns() + skew_ns
                sock.sendall(clockexchange.PONG.pack(t2, time.time_ns() + skew_ns))
            out.append(
                (
                    cmd,
                    clockexchange.RESULT.unpack(
                        clockexchange.read_exact(sock, 20, time.monotonic() + 10)
                    ),
                )
            )
        except OSError:
            out.append(None)

    for their_token, served in ((token, 1), (b"x" * 16, None)):
        server_side, client_side = socket.socketpair()
        got: list = []
        thread = threading.Thread(target=client, args=(client_side, their_token, got))
        thread.start()
        with server_side:
            server_side.settimeout(5.0)
            assert clockexchange.serve_one(server_side, token, 2, 16) == served
        thread.join(10)
        client_side.close()
        if served is None:
            assert got == [None]  # closed without a ping
            continue
        [(cmd, (low, high, pings))] = got
        assert cmd == b"r" and pings == 16
        assert low <= skew_ns <= high and high - low < 2_000_000  # ns, well under the skew


def test_a_stranger_trickling_bytes_is_cut_off_at_the_hello_timeout():
    server_side, client_side = socket.socketpair()
    with server_side, client_side:
        client_side.sendall(b"x")  # one byte of a 20-byte hello, then silence
        start = time.monotonic()
        assert clockexchange.serve_one(server_side, b"k" * 16, 2, 4) is None
        assert time.monotonic() - start < clockexchange.CONNECTION_S  # HELLO_S, not 5 s


def test_rank_0_stops_waiting_once_every_rank_is_served_or_gave_up():
    """A real TCPStore and listener: of ranks 1 and 2, rank 2 gives up (counts itself done
    without connecting); rank 0 returns with rank 1 served, long before its deadline."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    server = socket.create_server(("127.0.0.1", 0))
    token, key = b"t" * 16, "dpscope/clock_probe/test"
    got: list = []

    def rank1() -> None:
        with socket.create_connection(server.getsockname(), timeout=10) as conn:
            conn.sendall(clockexchange.HELLO.pack(token, 1))
            while clockexchange.read_exact(conn, 1, time.monotonic() + 10) == b"p":
                conn.sendall(clockexchange.PONG.pack(time.time_ns(), time.time_ns()))
            got.append(clockexchange.read_exact(conn, 20, time.monotonic() + 10))
        store.add(f"{key}/done", 1)

    thread = threading.Thread(target=rank1)
    thread.start()
    store.add(f"{key}/done", 1)  # rank 2 gave up
    start = time.monotonic()
    with server:
        served = clockexchange.serve_all(server, store, key, token, 3, 8)
    thread.join(10)
    assert served == {1} and len(got) == 1
    assert time.monotonic() - start < clockexchange.DEADLINE_S / 2


def test_a_job_of_one_process_has_no_probe():
    assert clockexchange.probe_clock("0") is None  # no process group: silently none


def _trace(path: Path, probe: object) -> Path:
    body = {
        "traceEvents": [
            {"ph": "X", "name": "aten::mm", "ts": 10.0, "dur": 5.0, "pid": 1, "tid": 1}
        ],
        "distributedInfo": {"rank": 1, "world_size": 2},
        CLOCK_PROBE_KEY: probe,
    }
    path.write_bytes(gzip.compress(json.dumps(body).encode()))
    return path


@pytest.mark.parametrize(
    "bad",
    [
        "yes",
        {"reference_rank": 0, "offset_us_low": 5.0, "offset_us_high": 1.0, "pings": 3, "probe_id": "w"},
        {"reference_rank": 0, "offset_us_low": 1.0, "offset_us_high": 2.0, "pings": 3},
        {"reference_rank": -1, "offset_us_low": 1.0, "offset_us_high": 2.0, "pings": 3, "probe_id": "w"},
        {"reference_rank": 0, "offset_us_low": 1.0, "offset_us_high": 2.0, "pings": 3, "probe_id": "w", "x": 1},
    ],
    ids=["not an object", "low above high", "no id", "negative rank", "unknown field"],
)  # fmt: skip
def test_a_bad_probe_is_one_warning_and_ignored(tmp_path, bad):
    loaded = load_trace(_trace(tmp_path / "rank1.pt.trace.json.gz", bad))
    assert loaded.clock_probe is None
    [warning] = loaded.warnings
    assert f"`{CLOCK_PROBE_KEY}` is not a dpscope clock probe — ignored" in warning
    assert decode_clock_probe(b"[1, 2]") is None


def test_the_shift_hook_moves_the_probe_and_refuses_the_reference_rank(tmp_path, monkeypatch):
    good = {"reference_rank": 0, "offset_us_low": -3.0, "offset_us_high": 4.0, "pings": 32,
            "probe_id": "w"}  # fmt: skip
    path = _trace(tmp_path / "rank1.pt.trace.json.gz", good)
    apply_clock_shift(path, 2500.0, 1)
    probe = load_trace(path).clock_probe
    assert (probe.offset_us_low, probe.offset_us_high) == (2497.0, 2504.0)
    ref = _trace(tmp_path / "rank0.pt.trace.json.gz", {**good, "pings": 0})
    with pytest.raises(ValueError, match="rank 0 is the clock reference"):
        apply_clock_shift(ref, 10.0, 0)
    monkeypatch.setenv("DPSCOPE_CLOCK_SHIFT", "0:5,1:3")
    with pytest.raises(ValueError, match="cannot shift rank 0: its clock is the reference"):
        clock_shift_us(1)
