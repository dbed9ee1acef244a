"""Hostile trace events: impossible events dropped and counted; events of the wrong JSON type,
`"rank": true` and deep nesting cost the event or the file, never the rank's neighbours or the
report. (The trace-level classes of issue 25 A/B are in tests/test_hostile_traces.py and
tests/test_hostile_trace_files.py.)"""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from analysis.errors import unexpected
from analysis.runs.compare import compare_runs
from analysis.trace.folder import analyze_trace_dir
from tests.hostile_common import (
    EVENT_CASES,
    clean_ranks,  # noqa: F401  (fixture)
    ddp_traces,  # noqa: F401  (fixture)
    deep_args,
    deep_top,
    extra_step,
    first_step,
    load_gz_json,
    with_bad_rank1,
)


def _to_the_last_bits(tree):
    """`tree` with each float to be matched within 1e-12 of itself: dropping events moves the
    chunks a trace is summed in, and a float sum in another order differs in its last bits."""
    if isinstance(tree, dict):
        return {k: _to_the_last_bits(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_to_the_last_bits(v) for v in tree]
    return pytest.approx(tree, rel=1e-12) if isinstance(tree, float) else tree


@pytest.mark.parametrize("case", list(EVENT_CASES))
@pytest.mark.integration
def test_impossible_events_are_dropped_and_counted(case, tmp_path, ddp_traces, clean_ranks):
    bad = with_bad_rank1(tmp_path, ddp_traces, EVENT_CASES[case])
    result = analyze_trace_dir(tmp_path, workers=1, progress=False)
    ranks = {r["rank"]: r for r in result["ranks"]}
    assert set(ranks) == {0, 1} and not result["skipped"]
    for key in ("steps", "step_time_us_mean", "comm_us", "compute_us"):  # as if never there
        assert ranks[1][key] == pytest.approx(clean_ranks[1][key]), key
    (line,) = [w for w in result["warnings"] if "impossible times" in w]
    assert bad.name in line and "dropped 1 event" in line
    assert ranks[1]["dropped_events"] == 1 and ranks[0]["dropped_events"] == 0


@pytest.mark.integration
def test_events_of_the_wrong_type_are_dropped_and_the_rest_analysed(
    tmp_path, ddp_traces, clean_ranks
):
    """A ts, tid or dur of the wrong JSON type (and an item that is not an event) used to fail the
    whole file's typed decode: now only those events are dropped, and everything else about the
    rank is exactly what the clean trace gives."""

    def edit(trace: dict) -> None:
        extra_step(ts="abc")(trace)
        extra_step(tid=[1])(trace)
        step = dict(first_step(trace), dur=None)  # `"dur": null`, not a missing dur
        trace["traceEvents"] += [step, "not an event"]

    bad = with_bad_rank1(tmp_path, ddp_traces, edit)
    result = analyze_trace_dir(tmp_path, workers=1, progress=False)
    ranks = {r["rank"]: r for r in result["ranks"]}
    assert set(ranks) == {0, 1} and not result["skipped"]
    assert ranks[1]["dropped_events"] == 4 and ranks[0]["dropped_events"] == 0
    ignore = {"file", "dropped_events", "warnings"}
    got = {k: v for k, v in ranks[1].items() if k not in ignore}
    assert got == _to_the_last_bits({k: v for k, v in clean_ranks[1].items() if k not in ignore})
    (line,) = [w for w in result["warnings"] if "impossible times" in w]
    assert bad.name in line and "dropped 4 event(s)" in line and "wrong JSON type" in line
    assert clean_ranks[1]["warnings"] == [] and ranks[1]["warnings"] == [line]


def test_dropped_events_reach_the_run_warnings(tmp_path, ddp_mlp_run):
    run = tmp_path / "ddp"
    shutil.copytree(ddp_mlp_run, run)
    r1 = sorted((run / "traces").glob("rank1*"))[0]
    trace = load_gz_json(r1)
    EVENT_CASES["negative-dur"](trace)
    r1.write_bytes(gzip.compress(json.dumps(trace).encode()))
    (entry,) = compare_runs([run], progress=False)["runs"]
    assert [r["rank"] for r in entry["trace"]["ranks"]] == [0, 1]
    assert any(r1.name in w and "dropped 1 event" in w for w in entry["warnings"])


@pytest.mark.integration
def test_rank_true_is_not_a_rank(tmp_path, ddp_traces, clean_ranks):
    """`"rank": true` in distributedInfo is not rank 1: the file name decides, with a warning."""
    shutil.copy(ddp_traces[0], tmp_path / "rank0.pt.trace.json.gz")
    trace = load_gz_json(ddp_traces[1])
    trace["distributedInfo"]["rank"] = True
    (tmp_path / "trace-b.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    result = analyze_trace_dir(tmp_path, workers=1, progress=False)
    assert [r["rank"] for r in result["ranks"]] == [0]
    assert any("trace-b" in s["file"] and "no rank" in s["reason"] for s in result["skipped"])
    assert any("distributedInfo.rank True" in w for w in result["warnings"])


@pytest.mark.parametrize("where", ["top level", "inside args"])
@pytest.mark.integration
def test_deeply_nested_trace_is_skipped_with_one_line(where, tmp_path, ddp_traces, clean_ranks):
    trace = load_gz_json(ddp_traces[1])
    text = (deep_top if where == "top level" else deep_args)(trace)
    bad = with_bad_rank1(tmp_path, ddp_traces, lambda t: None, text)
    result = analyze_trace_dir(tmp_path, workers=2, progress=False)
    assert [r["rank"] for r in result["ranks"]] == [0]
    assert result["ranks"][0]["step_time_us_mean"] == clean_ranks[0]["step_time_us_mean"]
    (hit,) = result["skipped"]
    assert hit["file"] == str(bad) and "nested too deeply" in hit["reason"]
    assert "\n" not in hit["reason"]


def test_deeply_nested_trace_inside_a_run_folder(tmp_path, ddp_mlp_run, single_mlp_run):
    """The run keeps its record and its good rank; the bad trace is one warning."""
    run = tmp_path / "runs" / "deep"
    shutil.copytree(ddp_mlp_run, run)
    shutil.copytree(single_mlp_run, tmp_path / "runs" / "single")
    r1 = sorted((run / "traces").glob("rank1*"))[0]
    r1.write_bytes(gzip.compress(deep_top(load_gz_json(r1)).encode()))
    result = compare_runs([tmp_path / "runs"], progress=False)
    (ddp,) = [r for r in result["runs"] if r["mode"] == "ddp"]
    assert ddp["samples_per_s"] and [r["rank"] for r in ddp["trace"]["ranks"]] == [0]
    assert any(r1.name in w and "nested too deeply" in w for w in ddp["warnings"])


def test_unexpected_errors_are_one_line():
    """RecursionError and MemoryError get a plain reason; anything else its type and message."""
    assert unexpected(RecursionError()).startswith("nested too deeply")
    assert unexpected(MemoryError()).startswith("ran out of memory")
    line = unexpected(KeyError("x\n" * 500))
    assert "KeyError" in line and "\n" not in line and len(line) < 400
