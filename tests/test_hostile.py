"""Hostile input (issue: one bad run or trace must never take the report down, nothing silently
wrong). Each case: the good items survive with their numbers, the bad one gets its one line.

Bad run folders are copies of the session's real runs (tests/conftest.py) with one field edited;
bad traces are the real DDP run's rank-1 trace with one event edited.
"""

from __future__ import annotations

import csv
import gzip
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from analysis.cli.main import main as analysis_main
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
