"""Hostile traces v2 (issue 25 B, trace-level classes): implausible times and sizes, repeated or
overlapping ProfilerSteps and odd single events are dropped and counted, never the rank, and the
rank's numbers stay those of the clean trace.

Each case edits the real DDP run's rank-1 trace (tests/conftest.py) as tests/test_hostile.py does.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from analysis.runs.compare import compare_runs
from analysis.trace.folder import analyze_trace_dir
from tests.conftest import REPO
from tests.test_hostile import (  # noqa: F401  (fixtures)
    _first_step,
    _with_bad_rank1,
    clean_ranks,
    ddp_traces,
)

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
        trace["traceEvents"].append({**_first_step(trace), **fields})

    return edit


# --- class 3: plausibility bounds (docs "Hostile input"): dropped and counted ----------------

FAR = {
    "ts-minus-1e20": _add(ts=-1e20),
    "ts-plus-1e20": _add(ts=1e20),
    "ts-zero": _add(ts=0),  # the trace's clock is ~5e12 µs: zero is two months away
    "ts-two-days-later": lambda t: _add(ts=_first_step(t)["ts"] + 2 * DAY_US)(t),
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
        step = _first_step(trace)
        name = step["name"] if number is None else f"ProfilerStep#{number}"
        trace["traceEvents"].append(
            {**step, "ts": step["ts"] + shift_frac * step["dur"], "name": name}
        )

    return edit


def _step_after_last(trace: dict) -> None:
    """A later step range reusing the first step's number (it does not overlap anything)."""
    steps = [e for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    last = max(steps, key=lambda e: e["ts"])
    trace["traceEvents"].append({**_first_step(trace), "ts": last["ts"] + last["dur"] + 10})


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


# --- class 6: decompression bombs and files that are not files -------------------------------

_BOMB_CHILD = """
import json, resource, sys
from analysis.trace.folder import analyze_trace_dir
from analysis.errors import AnalysisError
try:
    r = analyze_trace_dir(sys.argv[1], workers=1, progress=False)
    print(json.dumps({"skipped": r["skipped"]}))
except AnalysisError as err:
    print(json.dumps({"error": str(err)}))
print(json.dumps({"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
"""


def _gzip_stream(path, head: bytes, block: bytes, blocks: int, tail: bytes = b"") -> None:
    """A gzip of head + block×blocks + tail, written without holding the inflated text."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    with path.open("wb") as f:
        f.write(c.compress(head))
        for _ in range(blocks):
            f.write(c.compress(block))
        f.write(c.compress(tail) + c.flush())


def _run_child(folder, cap: int | None) -> list[dict]:
    env = dict(os.environ)
    if cap is not None:
        env["DPSCOPE_MAX_TRACE_BYTES"] = str(cap)
    proc = subprocess.run(
        [sys.executable, "-c", _BOMB_CHILD, str(folder)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


BOMBS = {  # name -> (head, block, blocks, tail): all inflate to 256 MiB or more
    "zeros": (b"", b"\0" * (1 << 20), 256, b""),
    "valid-json": (
        b'{"traceEvents": [',
        b'{"ph": "i", "name": "x", "ts": 1},' * 30_000,
        260,
        b"{}]}",
    ),
    "json-whitespace": (b'{"traceEvents": [' + b" " * 100, b" " * (1 << 20), 256, b"]}"),
}


@pytest.mark.parametrize("case", list(BOMBS))
def test_decompression_bomb_is_refused_with_bounded_memory(case, tmp_path):
    """With the cap at 32 MiB a 256 MiB inflation stops at the cap: one `skipped` line naming
    the file and the cap's variable, and the process never holds the inflated text."""
    _gzip_stream(tmp_path / "rank0.pt.trace.json.gz", *BOMBS[case])
    assert (tmp_path / "rank0.pt.trace.json.gz").stat().st_size < 4 << 20
    out = _run_child(tmp_path, 32 << 20)
    error = out[0].get("error") or ""
    assert "rank0.pt.trace.json.gz" in error and (
        "DPSCOPE_MAX_TRACE_BYTES" in error or "no JSON" in error
    )
    assert out[1]["rss_mb"] < 200  # the inflated text alone would be 256 MiB


def test_the_size_cap_applies_to_plain_json_too(tmp_path, ddp_traces):  # noqa: F811
    r1 = ddp_traces[1]
    (tmp_path / "rank1.pt.trace.json").write_bytes(gzip.decompress(r1.read_bytes()))
    out = _run_child(tmp_path, 10_000)
    assert "holds more than 10,000 bytes" in out[0]["error"]
    assert "traceEvents" not in out[0]["error"]


def test_a_bad_cap_is_one_line(tmp_path, ddp_traces):  # noqa: F811
    shutil.copy(ddp_traces[0], tmp_path / ddp_traces[0].name)
    out = _run_child(tmp_path, "lots")  # type: ignore[arg-type]
    assert "DPSCOPE_MAX_TRACE_BYTES" in out[0]["error"] and "'lots'" in out[0]["error"]


@pytest.mark.parametrize("kind", ["fifo", "fifo-as-the-path"])
def test_a_fifo_named_like_a_trace_is_skipped_not_waited_on(kind, tmp_path, ddp_traces):  # noqa: F811
    shutil.copy(ddp_traces[0], tmp_path / ddp_traces[0].name)
    fifo = tmp_path / "rank1.pt.trace.json"
    os.mkfifo(fifo)
    out = _run_child(fifo if kind == "fifo-as-the-path" else tmp_path, None)
    text = json.dumps(out[0])
    assert "rank1.pt.trace.json" in text and "not a regular file" in text


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


# --- class 3: the traces of a run folder vs its run.json --------------------------------------


def _world(n: int):
    def edit(run: Path) -> None:
        rec = json.loads((run / "run.json").read_text())
        rec["config"]["world_size"] = n
        (run / "run.json").write_text(json.dumps(rec))

    return edit


def _drop_rank1(run: Path) -> None:
    next((run / "traces").glob("rank1.*")).unlink()


def _rename_rank1(run: Path) -> None:
    r1 = next((run / "traces").glob("rank1.*"))
    r1.rename(r1.with_name("rank1.123.pt.trace.json.gz"))


def _symlink_rank1(run: Path) -> None:
    r1 = next((run / "traces").glob("rank1.*"))
    outside = run.parent / "elsewhere" / r1.name
    outside.parent.mkdir()
    r1.rename(outside)
    r1.symlink_to(outside)


CONSISTENCY = {  # name -> (edit of the run folder, words every expected warning holds)
    "world-8": (_world(8), ["world_size 8", "distributedInfo says world_size 2", "rank(s) 2, 3"]),
    "world-1": (_world(1), ["world_size 1", "distributedInfo says world_size 2"]),
    "missing-rank": (_drop_rank1, ["no trace for rank(s) 1"]),
    "another-runs-file": (_rename_rank1, ["rank1.123.pt.trace.json.gz: not among"]),
    "symlink-outside": (_symlink_rank1, ["a symbolic link to", "elsewhere"]),
}


@pytest.mark.parametrize("case", list(CONSISTENCY))
def test_traces_that_disagree_with_run_json_are_named(case, tmp_path, ddp_mlp_run):
    run = tmp_path / "ddp"
    shutil.copytree(ddp_mlp_run, run)
    edit, words = CONSISTENCY[case]
    edit(run)
    (entry,) = compare_runs([run], progress=False)["runs"]
    text = "\n".join(entry["warnings"])
    for w in words:
        assert w in text, (w, entry["warnings"])
    assert "run.json" in text or case in ("another-runs-file", "symlink-outside")


def test_a_consistent_run_has_no_consistency_warning(tmp_path, ddp_mlp_run):
    (entry,) = compare_runs([ddp_mlp_run], progress=False)["runs"]
    words = ("distributedInfo says", "no trace for rank", "not among", "symbolic link")
    assert not [w for w in entry["warnings"] if any(x in w for x in words)]
