"""`dpscope traces --executor dask`: a real dask.distributed LocalCluster (2 worker processes)
reduces a synthetic 64-rank job to exactly the serial result; a worker that dies costs only the
file it held; an unreachable scheduler, a bad scheduler file and a missing dask are one line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from analysis.cli.main import main as analysis_main
from analysis.trace.executors import Executor
from analysis.trace.folder import analyze_trace_dir
from bench.analysis import build_trace_set
from tests.conftest import DATA

dask = pytest.importorskip("dask")  # the [dask] extra; requirements.txt pins it
distributed = pytest.importorskip("distributed")

SOURCE = DATA / "hta" / "trace_filter" / "sampled_rank-0.json.gz"


@pytest.fixture(scope="module")
def job64(tmp_path_factory) -> Path:
    """The bench's generator: one real trace copied to 64 ranks (distributedInfo rewritten)."""
    out = tmp_path_factory.mktemp("job64")
    build_trace_set(out, 64, SOURCE)
    return out


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as c:
        yield c


@pytest.mark.integration
def test_local_cluster_gives_the_serial_json(job64, cluster, tmp_path, capsys):
    serial, dask_json = tmp_path / "serial.json", tmp_path / "dask.json"
    assert analysis_main(["traces", str(job64), "--workers", "1", "--no-progress",
                          "--json", str(serial)]) == 0  # fmt: skip
    argv = ["traces", str(job64), "--executor", "dask", "--scheduler", cluster.scheduler_address]
    assert analysis_main([*argv, "--no-progress", "--json", str(dask_json)]) == 0
    assert serial.read_bytes() == dask_json.read_bytes()
    result = json.loads(dask_json.read_text())
    assert len(result["ranks"]) == 64 and not result["partial"] and not result["skipped"]


class _KillOn(distributed.WorkerPlugin):
    """In each worker: the process exits (as if killed for memory) when it starts on `name`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def setup(self, worker) -> None:
        import analysis.trace.executors as ex

        real, name = ex.summarize_cached, self.name

        def dying(path, *, cache):
            if Path(path).name == name:
                os._exit(3)
            return real(path, cache=cache)

        ex.summarize_cached = dying


@pytest.mark.integration
def test_a_worker_that_dies_costs_only_its_file(tmp_path):
    build_trace_set(tmp_path, 4, SOURCE)
    victim = tmp_path / "rank2.pt.trace.json.gz"
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as c,
        distributed.Client(c) as client,
    ):
        client.register_plugin(_KillOn(victim.name))
        ex = Executor(kind="dask", scheduler=c.scheduler_address)
        result = analyze_trace_dir(tmp_path, progress=False, executor=ex)
    assert [r["rank"] for r in result["ranks"]] == [0, 1, 3]
    (lost,) = result["skipped"]
    assert lost["file"] == str(victim) and lost["worker_died"] and "died" in lost["reason"]
    assert result["partial"] and any("partial result" in w for w in result["warnings"])


def test_unreachable_scheduler_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("DPSCOPE_DASK_CONNECT_S", "0.5")
    argv = ["traces", str(SOURCE.parent), "--executor", "dask", "--scheduler", "tcp://127.0.0.1:9"]
    assert analysis_main([*argv, "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in line and "--scheduler" in line


def test_bad_scheduler_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "scheduler.json"
    bad.write_text("[]")
    argv = ["traces", str(SOURCE.parent), "--executor", "dask", "--scheduler-file", str(bad)]
    assert analysis_main([*argv, "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert str(bad) in line and "not a Dask scheduler file" in line


def test_scheduler_without_dask_executor_is_one_line(capsys):
    argv = ["traces", str(SOURCE.parent), "--scheduler", "tcp://127.0.0.1:8786"]
    assert analysis_main([*argv, "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--scheduler" in line and "--executor dask" in line


def test_dask_not_installed_names_the_pip_command(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` fails
    argv = ["traces", str(SOURCE.parent), "--executor", "dask", "--no-progress"]
    assert analysis_main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "not installed" in line and 'pip install "dpscope[dask]"' in line


@pytest.mark.integration
def test_a_process_worker_that_dies_costs_only_its_file(tmp_path, monkeypatch):
    """The process pool: the file in flight when a worker died is retried alone; the one that
    kills its worker again is named, the others analysed. Forked workers here, so that they carry
    this test's patch (dask is loaded in this process: the default would be forkserver, which
    starts them clean)."""
    import analysis.trace.executors as ex

    build_trace_set(tmp_path, 4, SOURCE)
    victim = tmp_path / "rank1.pt.trace.json.gz"
    real = ex.summarize_cached

    def dying(path, *, cache):
        if Path(path) == victim:
            os._exit(3)
        return real(path, cache=cache)

    monkeypatch.setattr(ex, "summarize_cached", dying)
    ex = Executor(workers=2, start_method="fork")
    result = analyze_trace_dir(tmp_path, workers=2, progress=False, executor=ex)
    assert [r["rank"] for r in result["ranks"]] == [0, 2, 3]
    (lost,) = result["skipped"]
    assert lost["file"] == str(victim) and lost["worker_died"] and result["partial"]
