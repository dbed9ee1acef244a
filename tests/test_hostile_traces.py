"""Hostile traces v2 (issue 25 B, trace-level classes): implausible times and sizes, repeated or
overlapping ProfilerSteps and odd single events are dropped and counted, never the rank, and the
rank's numbers stay those of the clean trace.

Each case edits the real DDP run's rank-1 trace (tests/conftest.py) as
tests/test_hostile_trace_events.py does.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys

import pytest

from analysis.report.__main__ import main as report_main
from analysis.runs.compare import compare_runs
from analysis.trace.folder import analyze_trace_dir
from tests.conftest import REPO
from tests.hostile_common import (  # noqa: F401  (fixtures)
    clean_ranks,
    ddp_traces,
    first_step,
)
from tests.hostile_common import with_bad_rank1 as _with_bad_rank1

_NUMBERS = ("steps", "step_numbers", "step_time_us_mean", "comm_us", "compute_us", "idle_us")
DAY_US = 86_400e6


def _analyse(tmp_path, ddp_traces, edit) -> tuple[dict, dict, str]:  # noqa: F811
    bad = _with_bad_rank1(tmp_path, ddp_traces, edit)
    result = analyze_trace_dir(tmp_path, workers=1, progress=False)
    ranks = {r["rank"]: r for r in result["ranks"]}
    assert set(ranks) == {0, 1} and not result["skipped"], result["skipped"]
    return result, ranks[1], bad.name


def _same_numbers(rank: dict, clean: dict) -> None:
    for key in _NUMBERS:
        assert rank[key] == pytest.approx(clean[key]), key


def _add(**fields):
    """Add one event: a copy of the first `cpu_op` with `fields` changed."""

    def edit(trace: dict) -> None:
        op = next(e for e in trace["traceEvents"] if e.get("cat") == "cpu_op")
        trace["traceEvents"].append({**op, **fields})

    return edit


def _add_step(**fields):
    def edit(trace: dict) -> None:
        trace["traceEvents"].append({**first_step(trace), **fields})

    return edit


# --- class 3: plausibility bounds (docs "Hostile input"): dropped and counted ----------------

FAR = {
    "ts-minus-1e20": _add(ts=-1e20),
    "ts-plus-1e20": _add(ts=1e20),
    "ts-zero": _add(ts=0),  # the trace's clock is ~5e12 µs: zero is two months away
    "ts-two-days-later": lambda t: _add(ts=first_step(t)["ts"] + 2 * DAY_US)(t),
    "step-ten-days": _add_step(dur=10 * DAY_US),
    "step-two-days": _add_step(dur=2 * DAY_US, name="ProfilerStep#99"),
    "op-ten-days": _add(dur=10 * DAY_US),
}


@pytest.mark.parametrize("case", list(FAR))
def test_implausible_times_are_dropped_and_counted(case, tmp_path, ddp_traces, clean_ranks):  # noqa: F811
    result, rank, name = _analyse(tmp_path, ddp_traces, FAR[case])
    _same_numbers(rank, clean_ranks[1])
    assert rank["dropped_events"] == 1
    (line,) = [w for w in result["warnings"] if "impossible times" in w]
    assert name in line and "dropped 1 event(s)" in line and "1 day" in line


def _memory(**args):
    """Add one [memory] event: a copy of the first one with `args` changed."""

    def edit(trace: dict) -> None:
        mem = next(e for e in trace["traceEvents"] if e.get("name") == "[memory]")
        trace["traceEvents"].append({**mem, "args": {**mem["args"], **args}})

    return edit


MEMORY = {
    "9e18-bytes": _memory(**{"Total Allocated": 9 * 10**18}),
    "above-int64": _memory(**{"Total Allocated": 2**63 + 5}),
    "above-uint64": _memory(**{"Total Allocated": 10**30}),
    "above-float64": _memory(**{"Total Allocated": 10**400}),  # valid JSON, beyond any float
    "negative-9e18-delta": _memory(Bytes=-(9 * 10**18)),
    "device-id-2e40": _memory(**{"Device Id": 2**40}),
    "device-type-negative": _memory(**{"Device Type": -3}),
    "string-total": _memory(**{"Total Allocated": "9e18"}),
    "far-ts": lambda t: _memory()(t) or t["traceEvents"][-1].update(ts=-1e20),
}


@pytest.mark.parametrize("case", list(MEMORY))
def test_implausible_memory_events_are_dropped_and_counted(
    case,
    tmp_path,
    ddp_traces,  # noqa: F811
    clean_ranks,  # noqa: F811
):
    result, rank, name = _analyse(tmp_path, ddp_traces, MEMORY[case])
    _same_numbers(rank, clean_ranks[1])
    (got,), (want,) = rank["memory"]["devices"], clean_ranks[1]["memory"]["devices"]
    assert {k: v for k, v in got.items() if k != "timeline"} == {
        k: v for k, v in want.items() if k != "timeline"
    }
    assert got["timeline"]["allocated_bytes"] == want["timeline"]["allocated_bytes"]
    assert got["timeline"]["t_us"] == pytest.approx(want["timeline"]["t_us"], abs=1e-6)
    (line,) = [w for w in result["warnings"] if "[memory] event(s) with implausible" in w]
    assert name in line and "dropped 1 [memory]" in line


# --- class 3: repeated and overlapping ProfilerSteps ----------------------------------------


def _step_copy(shift_frac: float, number: int | None):
    """A copy of the first step starting `shift_frac` of its duration later, renumbered."""

    def edit(trace: dict) -> None:
        step = first_step(trace)
        name = step["name"] if number is None else f"ProfilerStep#{number}"
        trace["traceEvents"].append(
            {**step, "ts": step["ts"] + shift_frac * step["dur"], "name": name}
        )

    return edit


def _step_after_last(trace: dict) -> None:
    """A later step range reusing the first step's number (it does not overlap anything)."""
    steps = [e for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    last = max(steps, key=lambda e: e["ts"])
    trace["traceEvents"].append({**first_step(trace), "ts": last["ts"] + last["dur"] + 10})


STEPS = {
    "exact-duplicate": (_step_copy(0, None), "repeats"),
    "nested-other-number": (_step_copy(0.25, 77), "overlaps"),
    "half-overlap": (_step_copy(0.5, 78), "overlaps"),
    "same-number-later": (_step_after_last, "repeats"),
}


@pytest.mark.parametrize("case", list(STEPS))
def test_repeated_or_overlapping_steps_are_dropped_with_a_warning(
    case,
    tmp_path,
    ddp_traces,  # noqa: F811
    clean_ranks,  # noqa: F811
):
    edit, word = STEPS[case]
    result, rank, name = _analyse(tmp_path, ddp_traces, edit)
    if case != "same-number-later":  # a repeat after the last step becomes the (dropped) last
        _same_numbers(rank, clean_ranks[1])
    assert len(set(rank["step_numbers"])) == len(rank["step_numbers"])
    (line,) = [w for w in result["warnings"] if "ProfilerStep range(s) that repeat or overlap" in w]
    first = clean_ranks[1]["step_numbers"][0]
    assert name in line and word in line and f"ProfilerStep#{first}" in line


# --- class 4: one odd event drops the event, not the rank -----------------------------------

ODD_STEPS = {
    "no-number": "ProfilerStep#",
    "arabic-indic-digit": "ProfilerStep#\u0663",
    "superscript-two": "ProfilerStep#\u00b2",
    "letters": "ProfilerStep#abc",
    "space-only": "ProfilerStep# ",
}


@pytest.mark.parametrize("case", list(ODD_STEPS))
def test_odd_step_names_drop_the_event(case, tmp_path, ddp_traces, clean_ranks):  # noqa: F811
    result, rank, name = _analyse(tmp_path, ddp_traces, _add_step(name=ODD_STEPS[case]))
    _same_numbers(rank, clean_ranks[1])
    assert rank["dropped_events"] == 1
    assert any(name in w and "without an ASCII number" in w for w in result["warnings"])


BASE_TIMES = {
    "string": '"1790857026000000000"',
    "float": "1.790857026e18",
    "above-int64": str(2**64 + 1),
    "negative": "-5",
    "object": '{"ns": 1}',
}


@pytest.mark.parametrize("case", list(BASE_TIMES))
def test_odd_base_time_is_a_warning_not_the_rank(case, tmp_path, ddp_traces, clean_ranks):  # noqa: F811
    r1 = ddp_traces[1]
    trace = json.loads(gzip.decompress(r1.read_bytes()))
    base = trace["baseTimeNanoseconds"]
    text = json.dumps(trace).replace(
        f'"baseTimeNanoseconds": {base}', f'"baseTimeNanoseconds": {BASE_TIMES[case]}'
    )
    assert BASE_TIMES[case] in text
    _with_bad_rank1(tmp_path, ddp_traces, lambda t: None, text=text)
    result = analyze_trace_dir(tmp_path, workers=1, progress=False)
    ranks = {r["rank"]: r for r in result["ranks"]}
    assert set(ranks) == {0, 1} and not result["skipped"]
    _same_numbers(ranks[1], clean_ranks[1])
    assert any(r1.name in w and "baseTimeNanoseconds" in w for w in result["warnings"])


# --- class 5: trace strings never reach the terminal raw -------------------------------------

HOSTILE_NAME = "\x1b]0;owned\x07aten::mm\x1b[2J\x9b31m\u202eevil\ud800"


def test_ops_and_diff_print_no_control_characters(tmp_path, ddp_mlp_run):
    """An operator name with OSC/CSI escapes, a C1 CSI, a bidi override and a lone surrogate:
    `ops` and `diff` print it escaped (`\\x1b`), never raw, and exit 0."""
    runs = []
    for name in ("a", "b"):
        run = tmp_path / name
        shutil.copytree(ddp_mlp_run, run)
        for trace in (run / "traces").glob("rank*.pt.trace.json.gz"):
            data = json.loads(gzip.decompress(trace.read_bytes()))
            for e in data["traceEvents"]:
                if e.get("name") == "aten::mm":
                    e["name"] = HOSTILE_NAME
            trace.write_bytes(gzip.compress(json.dumps(data).encode()))
        runs.append(run)
    for cmd in (["ops", str(runs[0]), "--top", "500"], ["diff", *map(str, runs), "--top", "500"]):
        proc = subprocess.run(
            [sys.executable, "-m", "analysis", *cmd],
            cwd=REPO,
            capture_output=True,
            timeout=300,
        )
        out = proc.stdout.decode("utf-8", "strict")
        assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
        assert not any(ch in out for ch in "\x1b\x07\x9b\u202e"), cmd
        assert "\\x1b]0;owned\\x07aten::mm" in out and "\\u202eevil" in out, cmd


@pytest.mark.parametrize(
    ("raw", "line"),
    [
        (b"\\ud800", "lone UTF-16 surrogate"),
        (b"\\udc80", "lone UTF-16 surrogate"),
        (b"\\udbff\\u0041", "lone UTF-16 surrogate"),
        # Raw in the text it is invalid UTF-8: that one event is of the wrong shape.
        (b"\xed\xa0\x80", "wrong JSON type"),
    ],
)
def test_a_lone_surrogate_costs_its_character_not_the_rank(
    raw,
    line,
    tmp_path,
    ddp_traces,  # noqa: F811
    clean_ranks,  # noqa: F811
):
    trace = json.loads(gzip.decompress(ddp_traces[1].read_bytes()))
    _add_step(name="ProfilerStep#PLACEHOLDER")(trace)
    text = json.dumps(trace).encode().replace(b"PLACEHOLDER", raw)
    shutil.copy(ddp_traces[0], tmp_path / ddp_traces[0].name)
    (tmp_path / ddp_traces[1].name).write_bytes(gzip.compress(text))
    result = analyze_trace_dir(tmp_path, workers=1, progress=False)
    ranks = {r["rank"]: r for r in result["ranks"]}
    assert set(ranks) == {0, 1} and not result["skipped"]
    _same_numbers(ranks[1], clean_ranks[1])  # the odd step name is dropped and counted
    assert ranks[1]["dropped_events"] == 1
    assert any(line in w and ddp_traces[1].name in w for w in result["warnings"])


def test_one_report_over_every_hostile_trace_keeps_the_numbers(tmp_path, ddp_mlp_run):
    """Every trace-level case above at once in one run's rank-1 trace: `runs` and `report` give
    that run the clean run's trace numbers, and the report builds (exit 0)."""
    clean, hostile = tmp_path / "clean" / "ddp", tmp_path / "hostile" / "ddp"
    shutil.copytree(ddp_mlp_run, clean)
    shutil.copytree(ddp_mlp_run, hostile)
    r1 = next((hostile / "traces").glob("rank1.*"))
    trace = json.loads(gzip.decompress(r1.read_bytes()))
    edits = [*FAR.values(), *MEMORY.values(), *(e for e, _ in STEPS.values())]
    edits += [_add_step(name=n) for n in ODD_STEPS.values()]
    for edit in edits:
        edit(trace)
    r1.write_bytes(gzip.compress(json.dumps(trace).encode()))
    keys = ("comm_pct", "exposed_comm_pct", "overlap_pct", "samples_per_s")
    (want,) = compare_runs([clean], progress=False)["runs"]
    (got,) = compare_runs([hostile], progress=False)["runs"]
    for key in keys:
        assert got[key] == pytest.approx(want[key]), key
    out = tmp_path / "report"
    assert report_main([str(hostile.parent), "--out", str(out), "--no-progress"]) == 0
    (row,) = json.loads((out / "summary.json").read_text())["runs"]
    for key in keys:
        assert row[key] == pytest.approx(want[key]), key
