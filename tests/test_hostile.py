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
from pathlib import Path

import pytest

from analysis.cli.main import main as analysis_main
from analysis.report.__main__ import main as report_main
from analysis.runs.compare import compare_runs
from tests.conftest import in_process, read_run
from tests.hostile_common import (
    EVENT_CASES,
    RUN_CASES,
    deep_top,
    load_gz_json,
    make_bad_runs,
    strict_json,
)


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory, single_mlp_run, ddp_mlp_run) -> Path:
    root = tmp_path_factory.mktemp("hostile-runs")
    make_bad_runs(root, single_mlp_run, ddp_mlp_run)
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


def test_runs_cli_lists_invalid_and_writes_valid_json(bad_runs, tmp_path):
    out = tmp_path / "runs.json"
    args = ["runs", str(bad_runs), "--no-traces", "--no-progress", "--json", str(out)]
    proc = in_process(analysis_main, args)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    data = strict_json(out.read_text())
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
    assert len(strict_json(out.read_text())["invalid"]) == 1


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
    trace = load_gz_json(r0)
    for case in EVENT_CASES.values():
        case(trace)
    r0.write_bytes(gzip.compress(json.dumps(trace).encode()))
    r1.write_bytes(gzip.compress(deep_top(load_gz_json(r1)).encode()))
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
