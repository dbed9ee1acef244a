"""The Python API (`import analysis`): the report's numbers as DataFrames and dicts, checked
against the report's own CSVs, the run records and the CLI's JSON; the docs' notebook example
runs as a script on a machine without torch."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import typing

import pandas as pd
import pytest

import analysis as dp
from analysis.cli.main import main as analysis_main
from tests.conftest import REPO, in_process, no_torch_env, read_run

FUNCTIONS = (
    "analyze_traces",
    "build_report",
    "collectives",
    "compare_runs",
    "load_collectives",
    "load_memory",
    "load_ops",
    "load_runs",
    "load_steps",
)


def test_the_api_is_exported_typed_and_documented() -> None:
    assert set(FUNCTIONS) | {"InputError", "ReportError", "UserError"} == set(dp.__all__)
    reference = (REPO / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    for name in FUNCTIONS:
        func = getattr(dp, name)
        hints = typing.get_type_hints(func)
        assert "return" in hints and func.__doc__, name
        assert f"`{name}(" in reference, f"docs/reference/api.md does not document {name}"
    assert issubclass(dp.ReportError, dp.UserError) and issubclass(dp.InputError, dp.UserError)


def test_bad_input_is_one_line(tmp_path) -> None:
    with pytest.raises(dp.InputError) as err:
        dp.load_runs(tmp_path / "nope")
    assert "\n" not in str(err.value) and "nope" in str(err.value)
    with pytest.raises(dp.InputError, match="none given"):
        dp.compare_runs()
    with pytest.raises(dp.ReportError):
        dp.build_report(tmp_path / "nope", out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def report(single_mlp_run, ddp_mlp_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("api-report")
    index = dp.build_report(single_mlp_run, ddp_mlp_run, out=out)
    assert index == out / "index.html" and index.is_file()
    return out


def test_load_runs_is_the_reports_run_table(single_mlp_run, ddp_mlp_run, report) -> None:
    runs = dp.load_runs(single_mlp_run, ddp_mlp_run)
    csv = pd.read_csv(report / "summary.csv", keep_default_na=False, na_values=[""])
    assert list(runs.columns) == [dp.api.RUN_TABLE_UNITS.get(c, c) for c in csv.columns]
    assert list(runs["run_id"]) == list(csv["run_id"])
    assert sorted(runs["run_id"]) == ["ddp-gloo-mlp", "single-mlp"]
    for column in ("samples_per_s", "speedup_ratio", "peak_memory_bytes", "top1_pct"):
        csv_column = {v: k for k, v in dp.api.RUN_TABLE_UNITS.items()}.get(column, column)
        assert runs[column].to_numpy() == pytest.approx(csv[csv_column].to_numpy()), column


def test_load_runs_numbers_by_hand_from_the_run_records(single_mlp_run, ddp_mlp_run) -> None:
    runs = dp.load_runs(single_mlp_run, ddp_mlp_run, traces=False).set_index("run_id")
    single = read_run(single_mlp_run)["metrics"]["samples_per_s"]
    ddp = read_run(ddp_mlp_run)["metrics"]["samples_per_s"]
    assert runs.loc["single-mlp", "samples_per_s"] == pytest.approx(single)
    assert runs.loc["ddp-gloo-mlp", "speedup_ratio"] == pytest.approx(ddp / single)
    assert runs.loc["ddp-gloo-mlp", "scaling_efficiency_ratio"] == pytest.approx(ddp / single / 2)


def test_collectives_match_the_traces_and_the_report(ddp_mlp_run, report) -> None:
    comm = dp.collectives(ddp_mlp_run)
    traces = dp.analyze_traces(ddp_mlp_run / "traces")
    assert traces["world_size"] == 2 and len(traces["ranks"]) == 2
    want = {c["name"]: c for c in traces["collectives"]}
    assert set(comm["name"]) == set(want) and "gloo:all_reduce" in want
    for row in comm.itertuples():
        assert row.run_id == "ddp-gloo-mlp"
        assert (row.calls, row.bytes_total) == (
            want[row.name]["calls"],
            want[row.name]["bytes_total"],
        )
    csv = pd.read_csv(report / "collectives.csv")
    assert list(csv.columns) == list(comm.columns)
    assert sorted(csv["bytes_total"]) == sorted(comm["bytes_total"])
    direct = dp.collectives(ddp_mlp_run / "traces")  # a folder of traces is accepted too
    assert list(direct["bytes_total"]) == list(comm["bytes_total"])


def test_compare_runs_is_the_cli_json(ddp_mlp_run, tmp_path) -> None:
    out = tmp_path / "runs.json"
    args = ["runs", str(ddp_mlp_run), "--json", str(out), "--no-progress"]
    proc = in_process(analysis_main, args)  # `python -m analysis runs ...`
    assert proc.returncode == 0, proc.stderr
    cli = json.loads(out.read_text())
    api = json.loads(json.dumps(dp.compare_runs(ddp_mlp_run)))
    assert api["runs"] == cli["runs"] and api["schema_version"] == cli["schema_version"]


def test_the_notebook_example_runs_as_a_script_without_torch(single_mlp_run, tmp_path) -> None:
    example = REPO / "docs" / "examples" / "api_tour.py"
    assert "# %%" in example.read_text(encoding="utf-8")  # percent-format cells
    runs = single_mlp_run.parent
    proc = subprocess.run(
        [sys.executable, str(example), str(runs), str(tmp_path / "report")],
        cwd=tmp_path,
        env=no_torch_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ddp-gloo-mlp" in proc.stdout and "overlap" in proc.stdout
    assert (tmp_path / "report" / "index.html").is_file()


@pytest.mark.integration
def test_an_unguarded_script_runs_once_beside_the_trace_pool(tmp_path) -> None:
    """Written the way users write it: no `if __name__ == "__main__":`, a thread of its own, a
    side effect at the top. The pool's workers (forkserver) must not re-run it."""
    from bench.analysis import build_trace_set
    from tests.conftest import DATA

    traces = tmp_path / "traces"
    traces.mkdir()
    build_trace_set(traces, 3, DATA / "hta" / "trace_filter" / "sampled_rank-0.json.gz")
    script = tmp_path / "analyse.py"
    script.write_text(
        "import threading, time\n"
        "import analysis as dp\n"
        "with open('ran.txt', 'a') as f:\n"
        "    f.write('ran\\n')\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        f"t = dp.analyze_traces({str(traces)!r}, workers=2)\n"
        "print('ranks', [r['rank'] for r in t['ranks']], 'skipped', len(t['skipped']))\n"
    )
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=no_torch_env(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks [0, 1, 2] skipped 0" in proc.stdout
    assert (tmp_path / "ran.txt").read_text() == "ran\n"  # once: no worker re-ran the script


def test_signatures_take_paths_variadically() -> None:
    for name in ("load_runs", "collectives", "compare_runs", "build_report"):
        params = inspect.signature(getattr(dp, name)).parameters
        assert next(iter(params.values())).kind is inspect.Parameter.VAR_POSITIONAL, name
