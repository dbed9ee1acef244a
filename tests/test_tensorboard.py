"""The real TensorBoard + torch-tb-profiler over run folders made by the real launcher.

Starts `python -m workloads.tools.tensorboard` (what `make tensorboard` runs) on a free loopback port
and checks, over HTTP, that each run folder is one run with its ranks as workers and that the
plugin's Distributed view answers. The process group we start is always stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port, run_in_repo
from workloads.tools import tensorboard as tb

PLUGIN = "/data/plugin/pytorch_profiler"


def _get(port: int, path: str, **params: str):
    url = f"http://127.0.0.1:{port}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _poll(fn, *, timeout_s: float, what: str):
    """Call fn until it returns a truthy value (the plugin loads runs in the background)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (urllib.error.URLError, ConnectionError, json.JSONDecodeError) as e:
            last = e
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last answer: {last!r}")


@pytest.fixture
def tensorboard_server(tmp_path: Path, ddp_mlp_run: Path, single_mlp_run: Path):
    # Copies, so that runs other tests add to the shared runs folder don't slow the plugin down.
    logdir = tmp_path / "runs"
    for run in (ddp_mlp_run, single_mlp_run):
        shutil.copytree(run / "traces", logdir / run.name / "traces")
    port = free_port()
    out = tmp_path / "tensorboard.log"
    with out.open("w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workloads.tools.tensorboard",
                "--logdir",
                str(logdir),
                "--port",
                str(port),
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield port, proc, out
    finally:
        # The wrapper stops TensorBoard on SIGTERM; the group kill is the safety net.
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


@pytest.mark.integration
def test_tensorboard_serves_runs_workers_and_distributed_view(tensorboard_server):
    port, proc, out = tensorboard_server
    ddp, single = "ddp-gloo-mlp/traces", "single-mlp/traces"

    listing = _poll(
        lambda: _get(port, "/data/plugins_listing"), timeout_s=180, what="TensorBoard to answer"
    )
    assert "pytorch_profiler" in listing, sorted(listing)

    def loaded():
        runs = _get(port, f"{PLUGIN}/runs")
        return runs if not runs["loading"] and {ddp, single} <= set(runs["runs"]) else None

    runs = _poll(loaded, timeout_s=180, what="the plugin to load both runs")
    assert sorted(runs["runs"]) == [ddp, single]  # one run per run folder
    assert _get(port, "/data/plugins_listing")["pytorch_profiler"]["enabled"] is True

    assert "Distributed" in _get(port, f"{PLUGIN}/views", run=ddp)
    assert _get(port, f"{PLUGIN}/workers", run=ddp, view="Overview") == ["rank0", "rank1"]
    assert _get(port, f"{PLUGIN}/workers", run=ddp, view="Distributed") == ["All"]
    assert _get(port, f"{PLUGIN}/workers", run=single, view="Overview") == ["rank0"]
    # A single-device run has no communication, so no Distributed view (don't mix the two).
    assert "Distributed" not in _get(port, f"{PLUGIN}/views", run=single)

    (span,) = _get(port, f"{PLUGIN}/spans", run=ddp, worker="All")
    overlap = _get(port, f"{PLUGIN}/distributed/overlap", run=ddp, worker="All", span=span)
    assert overlap["metadata"]["legends"] == [
        "Computation",
        "Overlapping",
        "Communication",
        "Other",
    ]
    per_worker = overlap["data"]["all"]
    assert set(per_worker) == {"rank0", "rank1"}
    assert all(len(v) == 4 and v[2] > 0 for v in per_worker.values())  # communication time > 0
    ops = _get(port, f"{PLUGIN}/distributed/commops", run=ddp, worker="All", span=span)
    names = {row[0] for row in ops["data"]["rank0"]["rows"]}
    assert "gloo:all_reduce" in names

    assert proc.poll() is None
    assert f"http://127.0.0.1:{port}/#pytorch_profiler" in out.read_text()


@pytest.mark.integration
def test_cli_rejects_folder_without_traces(tmp_path: Path):
    (tmp_path / "empty-run").mkdir()
    proc = run_in_repo(
        [
            sys.executable,
            "-m",
            "workloads.tools.tensorboard",
            "--logdir",
            str(tmp_path),
            "--port",
            "0",
        ]
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no *.pt.trace.json(.gz) traces" in lines[0], proc.stderr
    with pytest.raises(tb.TensorBoardError, match="no such folder"):
        tb.find_trace_dirs(tmp_path / "missing")


def test_port_checks_and_loopback_command(tmp_path: Path):
    with pytest.raises(tb.TensorBoardError, match="between 1 and 65535"):
        tb.check_port(0)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(tb.TensorBoardError, match="already in use"):
            tb.check_port(busy.getsockname()[1])
    cmd = tb.build_command(tmp_path, 6006)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[:3] == [sys.executable, "-m", "tensorboard.main"]


def test_the_runs_folder_is_a_positional_like_report_and_runs(tmp_path, capsys):
    """`dpscope tensorboard RUNS` (the shape of `dpscope report RUNS`); --logdir names the same."""
    missing = tmp_path / "nowhere"
    assert tb.main([str(missing)], prog="dpscope tensorboard") == 2
    assert f"{missing}: no such folder" in capsys.readouterr().err
    assert tb.main(["--logdir", str(missing)], prog="dpscope tensorboard") == 2
    assert f"{missing}: no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        tb.main([str(tmp_path), "--logdir", str(missing)], prog="dpscope tensorboard")
    assert exit_.value.code == 2
    assert "two runs folders given" in capsys.readouterr().err
