"""Clock offsets between hosts (analysis/trace/clocks.py) on hand-built collective calls whose
true times and clock offsets are known: the estimate must hold the truth within its uncertainty,
hosts pool their ranks, and what cannot be estimated is one warning."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from analysis.runs.entry import attach_trace, load_run
from analysis.trace.clocks import (
    align_clocks,
    check_clock_align,
    estimate_offsets,
    host_groups,
    offset_bounds,
)
from analysis.trace.loader import load_trace
from profiler.clockshift import apply_clock_shift, clock_shift_us, shifted_host
from profiler.runfolder.errors import InputError
from tests.conftest import copy_golden


def hand_built_job(offsets: dict[int, float], *, calls: int = 60, seed: int = 0) -> dict[int, dict]:
    """Each rank's `all_reduce` calls of a job: call k starts on rank r at T_k + its lateness
    (0-400 µs, so every rank is sometimes last) and ends on every rank 20-80 µs after the last
    arrival; rank r's clock reads true time + offsets[r]."""
    rng = np.random.default_rng(seed)
    ranks = sorted(offsets)
    t = np.arange(calls) * 2000.0
    arrive = {r: t + rng.uniform(0, 400, calls) for r in ranks}
    last = np.max([arrive[r] for r in ranks], axis=0)
    out = {}
    for r in ranks:
        end = last + rng.uniform(20, 80, calls)
        out[r] = {
            "all_reduce": {"start_us": arrive[r] + offsets[r], "end_us": end + offsets[r]},
        }
    return out


def test_each_hosts_offset_is_recovered_within_its_uncertainty():
    truth = {0: 0.0, 1: -5000.0, 2: 2500.0, 3: 5000.0}
    inst = hand_built_job(truth)
    offsets, warnings = estimate_offsets(inst, {0: "a", 1: "b", 2: "c", 3: "d"})
    assert warnings == []
    for r, true in truth.items():
        off = offsets[r]
        assert abs(off.offset_us - true) <= off.uncertainty_us, (r, off)
        assert off.uncertainty_us <= 80  # the bounds are as tight as the fastest finish
    assert offsets[0].source == "reference host" and offsets[1].calls == 60


def test_ranks_of_one_host_share_its_offset_and_the_reference_host_is_zero():
    truth = {0: 0.0, 1: 0.0, 2: 3000.0, 3: 3000.0}
    offsets, _ = estimate_offsets(hand_built_job(truth), {0: "a", 1: "a", 2: "b", 3: "b"})
    assert offsets[1].offset_us == 0.0 and offsets[1].uncertainty_us == 0.0
    assert offsets[2] == offsets[3] and offsets[2].calls == 4 * 60  # 2 ranks x 2 reference ranks
    assert abs(offsets[2].offset_us - 3000) <= offsets[2].uncertainty_us


def test_ranks_without_a_host_are_estimated_one_by_one():
    assert host_groups({0: "a", 1: None, 2: None, 3: "a"}) == {0: [0, 3], 1: [1], 2: [2]}
    truth = {0: 0.0, 1: 700.0, 2: -900.0}
    offsets, _ = estimate_offsets(hand_built_job(truth), {0: None, 1: None, 2: None})
    for r in (1, 2):
        assert abs(offsets[r].offset_us - truth[r]) <= offsets[r].uncertainty_us


def test_a_few_mismatched_calls_do_not_move_the_estimate():
    inst = hand_built_job({0: 0.0, 1: 4000.0}, calls=100)
    clean, _ = estimate_offsets(inst, {0: "a", 1: "b"})
    bad = inst[1]["all_reduce"]
    bad["start_us"][:2] += 2000.0  # two calls matched with the wrong collective
    bad["end_us"][:2] += 2000.0
    robust, warnings = estimate_offsets(inst, {0: "a", 1: "b"})
    assert warnings == []
    assert abs(robust[1].offset_us - 4000) <= robust[1].uncertainty_us
    assert abs(robust[1].offset_us - clean[1].offset_us) < 60


def test_too_few_or_contradicting_calls_leave_the_host_unaligned_with_one_warning():
    few = hand_built_job({0: 0.0, 1: 1000.0}, calls=2)
    offsets, warnings = estimate_offsets(few, {0: "a", 1: "b"})
    assert offsets[1].offset_us is None and offsets[1].source == "unaligned"
    assert len(warnings) == 1 and "rank 1 (host b): clock left unaligned" in warnings[0]
    assert "2 collective call(s)" in warnings[0] and "fewer than 3" in warnings[0]
    # Calls that cannot all be the same collectives (another job's trace): no interval fits.
    other = hand_built_job({0: 0.0, 1: 0.0}, calls=40)
    other[1]["all_reduce"]["start_us"] = other[1]["all_reduce"]["start_us"][::-1].copy()
    other[1]["all_reduce"]["end_us"] = other[1]["all_reduce"]["end_us"][::-1].copy()
    offsets, warnings = estimate_offsets(other, {0: "a", 1: "b"})
    assert offsets[1].offset_us is None and "contradict each other" in warnings[0]
    assert offset_bounds(np.array([5.0]), np.array([1.0])) is None
    assert estimate_offsets({}, {}) == ({}, [])


def test_modes_decide_which_offsets_are_removed():
    inst = hand_built_job({0: 0.0, 1: 5000.0, 2: 10.0})  # rank 2's offset is within its uncertainty
    hosts = {0: "a", 1: "b", 2: "c"}
    before = {r: inst[r]["all_reduce"]["start_us"].copy() for r in inst}
    offsets, shifted, _ = align_clocks(inst, hosts, "auto")
    assert shifted == {1}
    after = inst[1]["all_reduce"]["start_us"]
    assert np.allclose(after, before[1] - offsets[1].offset_us)
    assert np.array_equal(inst[2]["all_reduce"]["start_us"], before[2])
    _, shifted, _ = align_clocks(hand_built_job({0: 0.0, 1: 5000.0, 2: 10.0}), hosts, "force")
    assert shifted == {1, 2}
    offsets, shifted, warnings = align_clocks(hand_built_job({0: 0.0, 1: 5.0}), hosts, "off")
    assert offsets == {0: None, 1: None} and shifted == set() and warnings == []
    with pytest.raises(InputError, match="--clock-align: 'sometimes' is not a mode"):
        check_clock_align("sometimes")


def _trace(path: Path, host: object) -> Path:
    body = {
        "traceEvents": [
            {"ph": "X", "name": "aten::mm", "ts": 100.5, "dur": 5.0, "pid": 1, "tid": 1}
        ],
        "distributedInfo": {"rank": 1, "world_size": 2},
        "baseTimeNanoseconds": 0,
        "host_name": host,
    }
    path.write_bytes(gzip.compress(json.dumps(body).encode()))
    return path


@pytest.mark.parametrize(
    ("host", "expected"), [("node7", "node7"), (17, None), ("", None), ("x" * 300, None)]
)
def test_a_traces_host_is_read_and_a_bad_one_is_no_host(tmp_path, host, expected):
    assert load_trace(_trace(tmp_path / "rank1.pt.trace.json.gz", host)).host == expected


def test_the_clock_shift_hook_moves_every_time_and_names_a_host(tmp_path, monkeypatch):
    path = _trace(tmp_path / "rank1.pt.trace.json.gz", "node7")
    apply_clock_shift(path, -2500.25, 1)
    body = json.loads(gzip.decompress(path.read_bytes()))
    assert body["traceEvents"][0]["ts"] == 100.5 - 2500.25
    assert body["host_name"] == shifted_host("node7", 1) == "node7-shift1"
    monkeypatch.setenv("DPSCOPE_CLOCK_SHIFT", "1:-5000, 3:250.5")
    assert clock_shift_us(1) == -5000.0 and clock_shift_us(3) == 250.5 and clock_shift_us(0) is None
    monkeypatch.setenv("DPSCOPE_CLOCK_SHIFT", "one:5")
    with pytest.raises(ValueError, match="DPSCOPE_CLOCK_SHIFT must be RANK:US"):
        clock_shift_us(1)


def _hostless_run(tmp_path: Path, nnodes: int) -> Path:
    """A copy of the golden 2-rank run whose rank 1 is 3 ms ahead and whose traces name no host
    (traces of a tool that leaves `host_name` out), run.json saying `nnodes`."""
    run = copy_golden("ddp-gloo-mlp", tmp_path)
    for path in sorted((run / "traces").glob("rank*")):
        if path.name.startswith("rank1."):
            apply_clock_shift(path, 3000.0, 1)
        body = json.loads(gzip.decompress(path.read_bytes()))
        body.pop("host_name", None)
        path.write_bytes(gzip.compress(json.dumps(body).encode()))
    record = json.loads((run / "run.json").read_text())
    record["config"]["nnodes"] = nnodes
    (run / "run.json").write_text(json.dumps(record))
    return run


def _clock_row(run: Path) -> tuple[dict, list[str]]:
    entry = load_run(run)
    attach_trace(entry, run, progress=False)
    return entry.trace["ranks"][1], [w for w in entry.trace["warnings"] if "clock" in w]


def test_ranks_of_a_one_node_job_share_its_host_when_their_traces_name_none(tmp_path):
    """One node (run.json `config.nnodes` 1): every rank was on `env.hostname`, one clock, so
    nothing is estimated. The same traces as a 2-node job: rank 1 is estimated alone, and its 2
    traced all_reduces are too few (one warning, left unaligned)."""
    row, warnings = _clock_row(_hostless_run(tmp_path / "one", nnodes=1))
    assert (row["host"], row["clock_offset_us"], row["clock_aligned"]) == (None, 0.0, False)
    assert warnings == []
    row, warnings = _clock_row(_hostless_run(tmp_path / "two", nnodes=2))
    assert (row["clock_offset_us"], row["clock_aligned"]) == (None, False)
    assert len(warnings) == 1 and warnings[0].startswith(
        "rank 1 (no host in the trace): clock left"
    )
