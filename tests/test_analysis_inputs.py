"""Bad input: each bad file costs one clear line naming it, the good ranks are still analysed, and
the CLI exits non-zero only when nothing is usable. Also: analysis/ never imports torch."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.cli.main import main as analysis_main
from analysis.trace.folder import analyze_trace_dir
from profiler.runfolder.errors import InputError
from tests.conftest import DATA, REPO, in_process, no_torch_env

PAIR = DATA / "hta" / "trace_filter"
TB_NCCL = DATA / "tbplugin" / "test_distributed_nccl"


def cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m analysis ARGS --no-progress`, run in this process (in_process)."""
    return in_process(analysis_main, [*args, "--no-progress"])


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory) -> Path:
    """Two good ranks (0, 1) plus one file per kind of bad input."""
    d = tmp_path_factory.mktemp("bad")
    shutil.copy(PAIR / "sampled_rank-0.json.gz", d / "rank0.pt.trace.json.gz")
    shutil.copy(PAIR / "sampled_rank-1.json.gz", d / "rank1.pt.trace.json.gz")
    raw = (PAIR / "sampled_rank-1.json.gz").read_bytes()
    (d / "rank2.truncated.pt.trace.json.gz").write_bytes(raw[: len(raw) // 2])
    (d / "rank3.notjson.pt.trace.json").write_text("this is not JSON {")
    (d / "rank4.noevents.pt.trace.json").write_text(json.dumps({"schemaVersion": 1}))
    # Same content as rank 0 (distributedInfo says rank 0) under another name: a duplicate.
    shutil.copy(PAIR / "sampled_rank-0.json.gz", d / "rank9.copy.pt.trace.json.gz")
    # No distributedInfo and no rank in the name: never silently mapped to rank 0.
    shutil.copy(TB_NCCL / "worker1.pt.trace.json", d / "anonymous.pt.trace.json")
    return d


@pytest.fixture(scope="module")
def bad_result(bad_dir) -> dict:
    return analyze_trace_dir(bad_dir, progress=False)


def test_good_ranks_survive_bad_files(bad_result):
    assert [r["rank"] for r in bad_result["ranks"]] == [0, 1]
    assert bad_result["ranks"][0]["file"].endswith("rank0.pt.trace.json.gz")


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("rank2.truncated.pt.trace.json.gz", "truncated or corrupt gzip"),
        ("rank3.notjson.pt.trace.json", "not a Kineto JSON trace"),
        ("rank4.noevents.pt.trace.json", "no `traceEvents`"),
        ("rank9.copy.pt.trace.json.gz", "duplicate rank 0"),
        ("anonymous.pt.trace.json", "no rank in distributedInfo or file name"),
    ],
)
def test_each_bad_file_is_skipped_with_its_reason(bad_result, name, words):
    (hit,) = [s for s in bad_result["skipped"] if Path(s["file"]).name == name]
    assert words in hit["reason"] and " — " in hit["reason"] and "\n" not in hit["reason"]


def test_cli_lists_skipped_and_writes_json(bad_dir, tmp_path):
    out = tmp_path / "t.json"
    proc = cli("traces", str(bad_dir), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "skipped 5:" in proc.stdout
    for name in ("rank2.truncated", "rank3.notjson", "rank4.noevents", "rank9.copy", "anonymous"):
        assert name in proc.stdout
    data = json.loads(out.read_text())
    assert data["schema_version"] == 2 and len(data["ranks"]) == 2 and len(data["skipped"]) == 5


def test_no_profiler_step_is_analysed_as_one_step_with_a_warning(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(TB_NCCL / "worker0.pt.trace.json", traces / "rank0.pt.trace.json")
    out = tmp_path / "t.json"
    proc = cli("traces", str(traces), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "rank0.pt.trace.json: no ProfilerStep#N ranges" in proc.stdout
    (rank,) = json.loads(out.read_text())["ranks"]
    assert rank["steps"] == 1 and rank["step_time_us_mean"] > 0


def test_single_rankless_trace_is_rank_zero_with_a_warning(tmp_path):
    shutil.copy(TB_NCCL / "worker0.pt.trace.json", tmp_path / "dp.123.pt.trace.json")
    result = analyze_trace_dir(tmp_path, progress=False)
    assert result["ranks"][0]["rank"] == 0
    assert any("treated as rank 0" in w for w in result["warnings"])


def test_event_less_trace_and_spacing_of_distributed_info(tmp_path):
    (tmp_path / "x.pt.trace.json").write_text(
        '{ "distributedInfo" :\n {"rank":  7 ,"world_size":8},"traceEvents":[] }'
    )
    with pytest.raises(InputError, match="no profiler events"):
        analyze_trace_dir(tmp_path, progress=False)


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        (lambda d: None, "no trace files"),
        (lambda d: (d / "a.pt.trace.json").write_text("[1, 2"), "no usable trace"),
        (
            lambda d: (d / "rank0.json.gz").write_bytes(gzip.compress(b'{"traceEvents": "x"}')),
            "`traceEvents` is not a list",
        ),
    ],
)
def test_nothing_usable_is_one_error_line_and_nonzero_exit(tmp_path, setup, words):
    setup(tmp_path)
    proc = cli("traces", str(tmp_path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith(f"python -m analysis traces: error: {tmp_path}")
        and words in lines[0]
    )
    assert " — " in lines[0]


def test_runs_cli_on_missing_folder(tmp_path):
    proc = cli("runs", str(tmp_path / "nope"))
    assert proc.returncode == 2 and proc.stderr.startswith("python -m analysis runs: error: ")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_unwritable_json_is_one_error_line(tmp_path, where):
    (tmp_path / "f").write_text("")
    out = tmp_path if where == "a folder" else tmp_path / "f" / "t.json"
    proc = cli("traces", str(PAIR), "--json", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert (
        line.startswith(f"python -m analysis traces: error: {out}: cannot write the JSON")
        and "--json" in line
    )


@pytest.mark.integration
def test_json_is_written_even_when_the_reader_closes_the_pipe(tmp_path):
    """`python -m analysis traces DIR --json OUT | head`: the JSON must not be lost, and a
    closed stdout is no traceback."""
    out = tmp_path / "t.json"
    cmd = [sys.executable, "-m", "analysis", "traces", str(PAIR), "--json", str(out)]
    proc = subprocess.Popen(
        [*cmd, "--no-progress"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # the reader is gone before anything is printed
    stderr = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in stderr
    assert json.loads(out.read_text())["schema_version"] == 2


def test_analysis_never_imports_torch(single_mlp_run, ddp_mlp_run, comm_run, tmp_path):
    """Every analysis path a user runs (traces, compare_runs, build_report, `analysis project`)
    in one process where `import torch` fails, as on a machine without torch."""
    runs = ddp_mlp_run.parent
    code = f"""
import sys
from analysis.trace.folder import analyze_trace_dir
from analysis.runs.compare import compare_runs
from analysis.report.build import build_report
from analysis.cli.main import main
assert analyze_trace_dir({str(TB_NCCL)!r}, progress=False)["ranks"]
assert len(compare_runs([{str(runs)!r}], progress=False)["runs"]) >= 2
assert build_report([{str(runs)!r}], {str(tmp_path / "report")!r}, progress=False).index_html.is_file()
argv = ["project", {str(ddp_mlp_run)!r}, "--comm", {str(comm_run)!r}, "--ranks", "2,4"]
assert main([*argv, "--no-progress"]) == 0
assert "torch" not in sys.modules, "analysis imported torch"
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=no_torch_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_traces_of_different_jobs_in_one_folder_are_flagged(tmp_path):
    """A rank outside its world size, or ranks disagreeing on the world size, is a mixed folder:
    analysed, but said in `warnings` (cross-rank numbers would compare unrelated processes)."""
    for name, rank, world in (("rank1", 1, 2), ("rank5", 5, 2), ("rank2", 2, 4)):
        trace = json.loads((TB_NCCL / "worker0.pt.trace.json").read_text())
        trace["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
        (tmp_path / f"{name}.pt.trace.json").write_text(json.dumps(trace))
    result = analyze_trace_dir(tmp_path, progress=False)
    assert [r["rank"] for r in result["ranks"]] == [1, 2, 5]
    text = "\n".join(result["warnings"])
    assert "rank 5 is outside its world size 2" in text
    assert "disagree on the world size (2, 4)" in text
    assert "rank 1 is outside" not in text and "rank 2 is outside" not in text
