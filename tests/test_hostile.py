"""Hostile input (issue: one bad run or trace must never take the report down, nothing silently
wrong). Each case: the good items survive with their numbers, the bad one gets its one line.

Bad run folders are copies of the session's real runs (tests/conftest.py) with one field edited;
bad traces are the real DDP run's rank-1 trace with one event edited.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from analysis.cli.main import main as analysis_main
from analysis.errors import unexpected
from analysis.jsonsafe import finite_json
from analysis.report.__main__ import main as report_main
from analysis.runs.compare import compare_runs
from analysis.trace.folder import analyze_trace_dir
from tests.conftest import REPO, read_run

DEEP = 100_000  # levels of nesting: far past any recursion limit


def _strict_json(text: str) -> dict:
    """json.loads that refuses NaN/Infinity, as browsers' JSON.parse and jq do."""

    def refuse(token: str):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        **kw,
    )


# ---------------------------------------------------------------------------------------------
# Run folders: run.json and steps.csv validated at the boundary
# ---------------------------------------------------------------------------------------------


def _set(path: str, value) -> Callable[[dict], None]:
    """An edit of run.json: set the dotted `path` to `value`."""

    def edit(rec: dict) -> None:
        *parents, last = path.split(".")
        node = rec
        for key in parents:
            node = node[key]
        node[last] = value

    return edit


def _steps_cell(column: str, value: str) -> Callable[[Path], None]:
    """An edit of steps.csv: put `value` into `column` of the third data row."""

    def edit(path: Path) -> None:
        rows = list(csv.DictReader(path.open()))
        rows[2][column] = value
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)

    return edit


def _steps_extra_cell(path: Path) -> None:
    lines = path.read_text().splitlines()
    lines[3] += ",7"
    path.write_text("\n".join(lines) + "\n")


def _failed_with_string_error(rec: dict) -> None:
    rec.update(status="failed", error="rank 1 died", metrics={})


def _memory_rank_true(rec: dict) -> None:
    rec["metrics"]["memory"][0]["rank"] = True


def _dp_devices_string(rec: dict) -> None:
    rec["config"].update(mode="dp", backend="none", devices="cpu")


# name -> (base run, run.json edit, steps.csv edit, field named in the line)
RUN_CASES = {
    "metrics-list": ("ddp", _set("metrics", []), None, "`metrics`"),
    "env-list": ("ddp", _set("env", ["Linux"]), None, "`env`"),
    "error-string": ("ddp", _failed_with_string_error, None, "`error`"),
    "run-id-list": ("ddp", _set("run_id", ["a", "b"]), None, "`run_id`"),
    "mode-list": ("ddp", _set("config.mode", ["ddp"]), None, "`config.mode`"),
    "world-size-abc": ("ddp", _set("config.world_size", "abc"), None, "`config.world_size`"),
    "world-size-list": ("ddp", _set("config.world_size", [2]), None, "`config.world_size`"),
    "world-size-negative": ("ddp", _set("config.world_size", -2), None, "`config.world_size`"),
    "samples-per-s-string": (
        "ddp",
        _set("metrics.samples_per_s", "fast"),
        None,
        "`metrics.samples_per_s`",
    ),
    "memory-non-objects": ("ddp", _set("metrics.memory", [1, "x"]), None, "`metrics.memory[0]`"),
    "traces-int": ("ddp", _set("traces", 5), None, "`traces`"),
    "eval-best-list": ("ddp", _set("eval.best", [1]), None, "`eval.best`"),
    "step-time-int": ("ddp", _set("metrics.step_time_s", 5), None, "`metrics.step_time_s`"),
    "rank-true": ("ddp", _memory_rank_true, None, "`metrics.memory[0].rank`"),
    "baseline-negative": (
        "single",
        _set("metrics.samples_per_s", -5),
        None,
        "`metrics.samples_per_s`",
    ),
    "dp-devices-string": ("ddp", _dp_devices_string, None, "`config.devices`"),
    "schema-99": ("ddp", _set("schema_version", 99), None, "`schema_version`"),
    "status-unknown": ("ddp", _set("status", "great"), None, "`status`"),
    "steps-text-cell": ("ddp", None, _steps_cell("step_time_s", "abc"), "`step_time_s, line 4`"),
    "steps-warmup-text": ("ddp", None, _steps_cell("warmup", "yes"), "`warmup, line 4`"),
    "steps-inf": ("ddp", None, _steps_cell("data_s", "inf"), "`data_s, line 4`"),
    "steps-extra-cell": ("ddp", None, _steps_extra_cell, "`line 4`: more cells"),
    # schema 2 (issue 8) fields: typed too
    "warnings-string": ("ddp", _set("warnings", "slow"), None, "`warnings`"),
    "overhead-string": (
        "ddp",
        _set("metrics.profiler_overhead_pct", "high"),
        None,
        "`metrics.profiler_overhead_pct`",
    ),
    "overhead-below-minus-100": (
        "ddp",
        _set("metrics.profiler_overhead_pct", -150.0),
        None,
        "`metrics.profiler_overhead_pct`",
    ),
    "steps-profiled-2": ("ddp", None, _steps_cell("profiled", "2"), "`profiled, line 4`"),
}


def _make_bad_runs(root: Path, single: Path, ddp: Path) -> None:
    """Good runs (full copies, traces included) plus one folder per bad case (no traces)."""
    shutil.copytree(single, root / "good-single")
    shutil.copytree(ddp, root / "good-ddp")
    bases = {"single": single, "ddp": ddp}
    for name, (base, edit_json, edit_steps, _) in RUN_CASES.items():
        dst = root / name
        dst.mkdir()
        shutil.copy(bases[base] / "steps.csv", dst / "steps.csv")
        rec = read_run(bases[base])
        rec.update(run_id=name, traces=[])
        if edit_json:
            edit_json(rec)
        (dst / "run.json").write_text(json.dumps(rec))
        if edit_steps:
            edit_steps(dst / "steps.csv")
    deep = root / "nested-run-json"
    deep.mkdir()
    (deep / "run.json").write_text('{"schema_version": 1, "x": ' + "[" * DEEP + "]" * DEEP + "}")


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory, single_mlp_run, ddp_mlp_run) -> Path:
    root = tmp_path_factory.mktemp("hostile-runs")
    _make_bad_runs(root, single_mlp_run, ddp_mlp_run)
    return root


@pytest.fixture(scope="module")
def bad_runs_result(bad_runs) -> dict:
    return compare_runs([bad_runs], progress=False, traces=False)


def test_good_runs_survive_with_their_numbers(bad_runs_result, single_mlp_run, ddp_mlp_run):
    runs = {r["run_id"]: r for r in bad_runs_result["runs"]}
    assert set(runs) == {read_run(single_mlp_run)["run_id"], read_run(ddp_mlp_run)["run_id"]}
    ddp = runs[read_run(ddp_mlp_run)["run_id"]]
    assert ddp["samples_per_s"] == read_run(ddp_mlp_run)["metrics"]["samples_per_s"]
    # The baseline is the good single run, never the one with samples_per_s = -5.
    assert ddp["baseline_run_id"] == read_run(single_mlp_run)["run_id"] and ddp["speedup"] > 0
    assert ddp["phases_s"] is not None


@pytest.mark.parametrize("name", [*RUN_CASES, "nested-run-json"])
@pytest.mark.integration
def test_each_bad_run_is_invalid_with_one_line(bad_runs_result, name):
    (hit,) = [b for b in bad_runs_result["invalid"] if Path(b["path"]).name == name]
    words = RUN_CASES[name][3] if name in RUN_CASES else "nested too deeply"
    assert words in hit["reason"], hit["reason"]
    assert hit["file"].endswith(("run.json", "steps.csv")) and hit["file"] in hit["reason"]
    assert "\n" not in hit["reason"] and " — " in hit["reason"]
    assert name not in {r["run_id"] for r in bad_runs_result["runs"]}


@pytest.mark.integration
def test_dp_devices_string_never_counts_letters(bad_runs_result):
    """`devices: "cpu"` once counted 3 devices (c, p, u); now the run is invalid instead."""
    (hit,) = [b for b in bad_runs_result["invalid"] if b["path"].endswith("dp-devices-string")]
    assert "Expected `array" in hit["problem"] and "got `str`" in hit["problem"]


def test_schema_version_2_and_unknown_fields_are_accepted(tmp_path, ddp_mlp_run):
    """Newer writers bump schema_version to 2, add a steps.csv `profiled` column and new optional
    run.json fields: none of that invalidates a run."""
    dst = tmp_path / "v2"
    shutil.copytree(ddp_mlp_run, dst)
    rec = read_run(dst)
    rec["schema_version"] = 2
    rec["new_section"] = {"anything": [1, 2, 3]}
    rec["metrics"]["memory"][0]["new_field_bytes"] = 7
    rec["error"] = None
    rec["warnings"] = ["the writer's own warning"]
    assert isinstance(rec["metrics"]["profiler_overhead_pct"], float)  # a real schema-2 record
    (dst / "run.json").write_text(json.dumps(rec))
    _add_column = [dict(r, profiled="0") for r in csv.DictReader((dst / "steps.csv").open())]
    with (dst / "steps.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(_add_column[0]))
        writer.writeheader()
        writer.writerows(_add_column)
    result = compare_runs([dst], progress=False, traces=False)
    assert not result["invalid"] and result["runs"][0]["status"] == "ok"
    assert result["runs"][0]["memory"][0]["new_field_bytes"] == 7  # passed through verbatim
    assert "the writer's own warning" in result["runs"][0]["warnings"]
    assert result["runs"][0]["profiler_overhead_pct"] == rec["metrics"]["profiler_overhead_pct"]


def test_cut_off_steps_csv_of_a_failed_run_is_a_warning(tmp_path, ddp_mlp_run):
    """A run that did not finish may leave a half-written last row: not invalid, just no phases."""
    dst = tmp_path / "failed"
    shutil.copytree(ddp_mlp_run, dst)
    rec = read_run(dst)
    rec.update(status="failed", error={"message": "killed", "rank": 0, "exit_code": 9})
    (dst / "run.json").write_text(json.dumps(rec))
    *lines, last = (dst / "steps.csv").read_text().splitlines()
    (dst / "steps.csv").write_text("\n".join([*lines, ",".join(last.split(",")[:3])]))
    (run,) = compare_runs([dst], progress=False, traces=False)["runs"]
    assert run["status"] == "failed" and run["phases_s"] is None
    assert any("steps.csv" in w and "line" in w for w in run["warnings"])


@pytest.mark.integration
def test_runs_cli_lists_invalid_and_writes_valid_json(bad_runs, tmp_path):
    out = tmp_path / "runs.json"
    proc = cli(
        "-m", "analysis", "runs", str(bad_runs), "--no-traces", "--no-progress", "--json", str(out)
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    data = _strict_json(out.read_text())
    assert len(data["invalid"]) == len(RUN_CASES) + 1
    assert f"invalid {len(RUN_CASES) + 1}:" in proc.stdout
    assert "config.world_size" in proc.stdout


@pytest.mark.integration
def test_runs_cli_exits_2_when_every_run_is_invalid(bad_runs, tmp_path, capsys):
    """Still lists the invalid run (and writes the JSON), then one error line: nothing usable."""
    shutil.copytree(bad_runs / "world-size-abc", tmp_path / "runs" / "world-size-abc")
    out = tmp_path / "runs.json"
    args = ["runs", str(tmp_path / "runs"), "--no-traces", "--no-progress", "--json", str(out)]
    assert analysis_main(args) == 2
    captured = capsys.readouterr()
    assert "invalid 1:" in captured.out and "config.world_size" in captured.out
    (line,) = captured.err.strip().splitlines()
    assert (
        line.startswith("python -m analysis runs: error: ") and "no run could be analysed" in line
    )
    assert len(_strict_json(out.read_text())["invalid"]) == 1


# ---------------------------------------------------------------------------------------------
# Traces: impossible events dropped and counted; any exception costs one file
# ---------------------------------------------------------------------------------------------


def _load(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _first_step(trace: dict) -> dict:
    return next(e for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))


def _extra_step(**fields) -> Callable[[dict], None]:
    """Add one more ProfilerStep copy with `fields` changed (None deletes the field)."""

    def edit(trace: dict) -> None:
        ev = dict(_first_step(trace))
        for k, v in fields.items():
            if v is None:
                ev.pop(k, None)
            else:
                ev[k] = v
        trace["traceEvents"].append(ev)

    return edit


# name -> trace edit; each adds one impossible ProfilerStep the analysis must drop
EVENT_CASES = {
    "negative-dur": _extra_step(dur=-5000),
    "no-ts": _extra_step(ts=None),
    "no-dur": _extra_step(dur=None),
    "huge-dur": _extra_step(dur=1e308),
}


@pytest.fixture(scope="module")
def ddp_traces(ddp_mlp_run) -> tuple[Path, Path]:
    r0, r1 = sorted((ddp_mlp_run / "traces").glob("rank*.pt.trace.json.gz"))
    return r0, r1


@pytest.fixture(scope="module")
def clean_ranks(ddp_traces, tmp_path_factory) -> dict[int, dict]:
    d = tmp_path_factory.mktemp("clean")
    for f in ddp_traces:
        shutil.copy(f, d / f.name)
    return {r["rank"]: r for r in analyze_trace_dir(d, workers=1, progress=False)["ranks"]}


def _with_bad_rank1(tmp: Path, ddp_traces, edit: Callable[[dict], None], text: str | None = None):
    r0, r1 = ddp_traces
    shutil.copy(r0, tmp / r0.name)
    trace = _load(r1)
    edit(trace)
    data = (text or json.dumps(trace)).encode()
    (tmp / r1.name).write_bytes(gzip.compress(data))
    return tmp / r1.name


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
