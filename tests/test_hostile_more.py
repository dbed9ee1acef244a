"""test_hostile, continued (split for length): more damaged inputs."""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import shutil

import pytest

from analysis.cli.main import main as analysis_main
from analysis.errors import unexpected
from analysis.jsonsafe import finite_json
from analysis.report.__main__ import main as report_main
from analysis.runs.compare import compare_runs
from analysis.trace.folder import analyze_trace_dir
from tests.conftest import read_run
from tests.test_hostile import (  # noqa: F401
    DEEP,
    EVENT_CASES,
    RUN_CASES,
    _dp_devices_string,
    _extra_step,
    _failed_with_string_error,
    _first_step,
    _load,
    _make_bad_runs,
    _memory_rank_true,
    _set,
    _steps_cell,
    _steps_extra_cell,
    _strict_json,
    _with_bad_rank1,
    bad_runs,
    bad_runs_result,
    clean_ranks,
    cli,
    ddp_traces,
)


@pytest.mark.parametrize("case", list(EVENT_CASES))
@pytest.mark.integration
def test_impossible_events_are_dropped_and_counted(case, tmp_path, ddp_traces, clean_ranks):
    bad = _with_bad_rank1(tmp_path, ddp_traces, EVENT_CASES[case])
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
        _extra_step(ts="abc")(trace)
        _extra_step(tid=[1])(trace)
        step = dict(_first_step(trace), dur=None)  # `"dur": null`, not a missing dur
        trace["traceEvents"] += [step, "not an event"]

    bad = _with_bad_rank1(tmp_path, ddp_traces, edit)
    result = analyze_trace_dir(tmp_path, workers=1, progress=False)
    ranks = {r["rank"]: r for r in result["ranks"]}
    assert set(ranks) == {0, 1} and not result["skipped"]
    assert ranks[1]["dropped_events"] == 4 and ranks[0]["dropped_events"] == 0
    ignore = {"file", "dropped_events", "warnings"}
    got = {k: v for k, v in ranks[1].items() if k not in ignore}
    assert got == {k: v for k, v in clean_ranks[1].items() if k not in ignore}
    (line,) = [w for w in result["warnings"] if "impossible times" in w]
    assert bad.name in line and "dropped 4 event(s)" in line and "wrong JSON type" in line
    assert clean_ranks[1]["warnings"] == [] and ranks[1]["warnings"] == [line]


def test_dropped_events_reach_the_run_warnings(tmp_path, ddp_mlp_run):
    run = tmp_path / "ddp"
    shutil.copytree(ddp_mlp_run, run)
    r1 = sorted((run / "traces").glob("rank1*"))[0]
    trace = _load(r1)
    EVENT_CASES["negative-dur"](trace)
    r1.write_bytes(gzip.compress(json.dumps(trace).encode()))
    (entry,) = compare_runs([run], progress=False)["runs"]
    assert [r["rank"] for r in entry["trace"]["ranks"]] == [0, 1]
    assert any(r1.name in w and "dropped 1 event" in w for w in entry["warnings"])


@pytest.mark.integration
def test_rank_true_is_not_a_rank(tmp_path, ddp_traces, clean_ranks):
    """`"rank": true` in distributedInfo is not rank 1: the file name decides, with a warning."""
    shutil.copy(ddp_traces[0], tmp_path / "rank0.pt.trace.json.gz")
    trace = _load(ddp_traces[1])
    trace["distributedInfo"]["rank"] = True
    (tmp_path / "trace-b.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    result = analyze_trace_dir(tmp_path, workers=1, progress=False)
    assert [r["rank"] for r in result["ranks"]] == [0]
    assert any("trace-b" in s["file"] and "no rank" in s["reason"] for s in result["skipped"])
    assert any("distributedInfo.rank True" in w for w in result["warnings"])


def _deep_top(trace: dict) -> str:
    return json.dumps(trace)[:-1] + ', "deep": ' + "[" * DEEP + "]" * DEEP + "}"


def _deep_args(trace: dict) -> str:
    text = json.dumps(trace)
    marker = '"args": {'
    i = text.index(marker) + len(marker)
    return text[:i] + '"deep": ' + "[" * DEEP + "]" * DEEP + ", " + text[i:]


@pytest.mark.parametrize("where", ["top level", "inside args"])
@pytest.mark.integration
def test_deeply_nested_trace_is_skipped_with_one_line(where, tmp_path, ddp_traces, clean_ranks):
    trace = _load(ddp_traces[1])
    text = (_deep_top if where == "top level" else _deep_args)(trace)
    bad = _with_bad_rank1(tmp_path, ddp_traces, lambda t: None, text)
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
    r1.write_bytes(gzip.compress(_deep_top(_load(r1)).encode()))
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


# ---------------------------------------------------------------------------------------------
# JSON output always valid; output paths checked before any work
# ---------------------------------------------------------------------------------------------


def test_non_finite_values_become_null_with_a_warning():
    warnings: list[str] = []
    out = finite_json({"a": math.inf, "b": [1.0, math.nan], "c": {"d": -math.inf}}, warnings)
    assert out == {"a": None, "b": [1.0, None], "c": {"d": None}}
    assert sorted(w.split("`")[1] for w in warnings) == ["a = inf", "b[1] = nan", "c.d = -inf"]
    json.dumps(out, allow_nan=False)


@pytest.mark.integration
def test_huge_dur_gives_valid_json_from_the_cli(tmp_path, ddp_traces):
    (tmp_path / "t").mkdir()
    _with_bad_rank1(tmp_path / "t", ddp_traces, EVENT_CASES["huge-dur"])
    out = tmp_path / "t.json"
    proc = cli("-m", "analysis", "traces", str(tmp_path / "t"), "--json", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    data = _strict_json(out.read_text())
    assert all(r["step_time_us_mean"] < 1e12 for r in data["ranks"])
    assert any("impossible times" in w for w in data["warnings"])


@pytest.mark.parametrize("target", [".", "/", "", "input"])
@pytest.mark.integration
def test_bad_json_out_is_refused_before_work(target, tmp_path, ddp_traces, capsys):
    d = tmp_path / "traces"
    d.mkdir()
    for f in ddp_traces:
        shutil.copy(f, d / f.name)
    trace = d / ddp_traces[0].name
    before = trace.read_bytes()
    out = str(trace) if target == "input" else target
    assert analysis_main(["traces", str(d), "--json", out, "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "cannot write the JSON" in line and "--json" in line
    assert trace.read_bytes() == before


def test_json_out_inside_a_run_folder_is_refused(tmp_path, single_mlp_run, capsys):
    run = tmp_path / "single"
    shutil.copytree(single_mlp_run, run)
    before = (run / "run.json").read_bytes()
    assert analysis_main(["runs", str(run), "--json", str(run / "run.json"), "--no-traces"]) == 2
    assert "cannot write the JSON" in capsys.readouterr().err
    assert (run / "run.json").read_bytes() == before


@pytest.mark.parametrize("target", ["", ".", "/", "file", "input", "inside-run"])
def test_bad_report_out_is_refused_before_work(target, tmp_path, single_mlp_run, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(single_mlp_run, runs / "single")
    (tmp_path / "file").write_text("keep")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("keep")
    out = {
        "file": tmp_path / "file",
        "input": runs,
        "inside-run": runs / "single" / "report",
    }.get(target, target)
    assert report_main([str(runs), "--out", str(out), "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "cannot write the report" in line and "--out" in line
    assert (runs / "single" / "run.json").is_file() and not (runs / "single" / "report").exists()
    assert (tmp_path / "file").read_text() == "keep"
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "keep"


def test_report_into_a_folder_with_other_files_keeps_them(tmp_path, single_mlp_run):
    """`make report` writes into reports/, which holds the project's README.md and bench/: the
    report swaps in its own files only, and a second report removes what the first wrote and
    the second does not (from the first one's manifest), never a foreign file."""
    runs = tmp_path / "runs"
    shutil.copytree(single_mlp_run, runs / "single")
    out = tmp_path / "reports"
    (out / "bench").mkdir(parents=True)
    (out / "README.md").write_text("keep")
    (out / "bench" / "overhead.json").write_text("{}")
    assert report_main([str(runs), "--out", str(out), "--no-progress"]) == 0
    assert (out / "index.html").is_file() and (out / "README.md").read_text() == "keep"
    (out / "stale.csv").write_text("old")  # as if the previous report had written it
    manifest = out / ".dpscope-report.json"
    manifest.write_text(json.dumps([*json.loads(manifest.read_text()), "stale.csv"]))
    assert report_main([str(runs), "--out", str(out), "--no-progress"]) == 0
    assert not (out / "stale.csv").exists()
    assert (out / "README.md").read_text() == "keep" and (out / "bench" / "overhead.json").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".report-")]  # no staging left


@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_FSIZE is POSIX-only")
@pytest.mark.integration
def test_failed_report_write_leaves_the_previous_report_whole(tmp_path):
    """A real write failure part-way (the file-size limit hit on index.html, after the CSVs and
    summary.json were written): the error names the file and the previous report is untouched."""
    import resource
    import signal

    from analysis.report.build import _replace_folder

    out = tmp_path / "report"
    files = {"summary.csv": "a\n1\n", "summary.json": "{}\n", "index.html": "new" * 100_000}
    _replace_folder({**files, "index.html": "old"}, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, 64_000))

    code = (
        "import json, sys; from pathlib import Path\n"
        "from analysis.report.build import ReportError, _replace_folder\n"
        "files = json.loads(sys.argv[2]); files['index.html'] *= 100_000\n"
        "try: _replace_folder(files, Path(sys.argv[1]))\n"
        "except ReportError as e: sys.exit(f'report: {e}')\n"
    )
    arg = json.dumps({**files, "index.html": "new"})  # a 300 kB argument would be too long
    proc = cli("-c", code, str(out), arg, preexec_fn=limit)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "(index.html)" in line and "File too large" in line
    assert "previous report is unchanged" in line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no staging folder left


# ---------------------------------------------------------------------------------------------
# Long strings; the report over every bad run at once
# ---------------------------------------------------------------------------------------------


def test_report_builds_from_good_and_every_bad_run(bad_runs, tmp_path, single_mlp_run, ddp_mlp_run):
    """The whole mixed folder, traces included, plus a run with a 2 MB env.os and a run with bad
    traces: the report lists every bad run as invalid, keeps the good numbers (the bad traces cost
    one warning each), and the long string is clipped on the page but whole in summary.json."""
    long_run = bad_runs.parent / f"{bad_runs.name}-long" / "long-os"
    shutil.copytree(single_mlp_run, long_run)
    rec = read_run(long_run)
    rec.update(run_id="long-os", traces=[])
    rec["env"]["os"] = "L" * 2_000_000
    (long_run / "run.json").write_text(json.dumps(rec))
    # A DDP run whose rank-0 trace holds impossible events and whose rank-1 trace is 100,000 deep.
    traced = long_run.parent / "bad-traces"
    shutil.copytree(ddp_mlp_run, traced)
    rec = read_run(traced)
    rec["run_id"] = "bad-traces"
    (traced / "run.json").write_text(json.dumps(rec))
    r0, r1 = sorted((traced / "traces").glob("rank*"))
    trace = _load(r0)
    for case in EVENT_CASES.values():
        case(trace)
    r0.write_bytes(gzip.compress(json.dumps(trace).encode()))
    r1.write_bytes(gzip.compress(_deep_top(_load(r1)).encode()))
    out = tmp_path / "report"
    assert (
        report_main([str(bad_runs), str(long_run.parent), "--out", str(out), "--no-progress"]) == 0
    )
    rows = {r["run_id"]: r for r in csv.DictReader((out / "summary.csv").open())}
    for name in [*RUN_CASES, "nested-run-json"]:
        assert rows[name]["status"] == "invalid" and rows[name]["reason"], name
    good = [r for r in rows.values() if r["status"] == "ok" and r["run_id"] != "long-os"]
    assert len(good) == 3 and all(float(r["samples_per_s"]) > 0 for r in good)
    reason = rows["bad-traces"]["reason"]
    assert f"{r0.name}: dropped {len(EVENT_CASES)} event(s)" in reason
    assert f"{r1.name}: nested too deeply" in reason
    html = (out / "index.html").read_text(encoding="utf-8")
    assert "L" * 2_000_000 not in html and "L" * 200 + "…" in html
    assert len(html) < 5_000_000
    summary = json.loads((out / "summary.json").read_text())
    (long,) = [r for r in summary["runs"] if r["run_id"] == "long-os"]
    assert long["os"] == "L" * 2_000_000
