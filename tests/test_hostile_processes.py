"""Hostile input v4 (issue 36), the process class, with real processes: the launcher waits for
the job, not for what the job left running; a launcher killed by SIGKILL takes its job with it
and leaves a run that readers show as `failed (launcher killed)`; `tune` stopped by SIGTERM
leaves a tune.json that says so."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from analysis.runs.compare import compare_runs
from tests.conftest import REPO, read_run
from workloads.launch.child import child_env

# serial: its signals land at points timed by the launcher's progress.
pytestmark = pytest.mark.serial

FAST = "--max-steps 2 --warmup-steps 1 --batch-size 32 --no-profile --device cpu --threads 1"


def _poll(predicate, *, timeout: float, every: float = 0.2):
    """`predicate()` once it is truthy, polled until `timeout` s (then its last value)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(every)
    return value


LEAVER = """
import subprocess, sys
from torch import nn


def net(num_classes=10, input_shape=(3, 32, 32)):
    # Only in the training process (the launcher checks the factory too): a background child
    # that outlives the rank, holding the output pipe, as a careless script's daemon would.
    if "workloads/train" in sys.argv[0].replace("\\\\", "/"):
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True)
        open("leftover.pid", "w").write(str(p.pid))
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, num_classes))
"""


@pytest.mark.integration
def test_the_launcher_ends_what_the_job_left_running(tmp_path):
    """A job whose background child outlived it made the launcher wait until the child ended
    (forever for a daemon). The child here left its session, so only the launcher's subreaper
    role (Linux) or its watch of the job's tree finds it."""
    (tmp_path / "leaver.py").write_text(LEAVER)
    cmd = [sys.executable, "-m", "workloads.launch", "--model", "leaver:net", *FAST.split()]
    cmd += ["--run-id", "left", "--runs-dir", str(tmp_path / "runs")]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pid = int((tmp_path / "leftover.pid").read_text())
    assert f"left 1 process(es) running after it exited: pid {pid} (" in proc.stderr
    assert "time.sleep(600)" in proc.stderr
    assert _poll(lambda: not psutil.pid_exists(pid), timeout=60)
    run = read_run(tmp_path / "runs" / "left")
    assert run["status"] == "ok"
    assert any(f"pid {pid}" in w for w in run["warnings"])


def _train_pids(logs: Path) -> list[int]:
    pids = []
    for beat in logs.glob("rank*.heartbeat.json"):
        try:
            pids.append(json.loads(beat.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return []
    return pids


@pytest.mark.integration
def test_a_sigkilled_launcher_takes_its_job_and_reads_as_killed(tmp_path):
    """`kill -9` of the launcher left training running as an orphan and run.json `running`."""
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "workloads.launch", "--mode", "ddp", "--backend", "gloo"]
    cmd += ["--nproc", "2", "--model", "mlp", "--max-steps", "100000", "--batch-size", "16"]
    cmd += ["--no-profile", "--device", "cpu", "--threads", "1", "--run-id", "orphan"]
    launcher = subprocess.Popen(
        [*cmd, "--runs-dir", str(runs)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    logs = runs / "orphan" / "logs"
    try:
        ranks = _poll(lambda: (p := _train_pids(logs)) and len(p) == 2 and p, timeout=180)
        assert ranks, "the ranks never wrote a heartbeat"
        job = psutil.Process(launcher.pid).children(recursive=True)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        gone = _poll(lambda: not any(p.is_running() for p in job), timeout=90)
        assert gone, [p for p in job if p.is_running()]
        assert all(not psutil.pid_exists(pid) for pid in ranks)
    finally:
        for p in psutil.Process().children(recursive=True):
            p.kill()
    assert read_run(runs / "orphan")["status"] == "running"  # as the launcher left it
    (entry,) = compare_runs([runs], progress=False, traces=False)["runs"]
    assert entry["status"] == "failed" and entry["error"]["kind"] == "launcher_killed"
    assert f"its launcher (pid {launcher.pid}) is no longer running" in entry["error"]["message"]
    out = subprocess.run(
        [sys.executable, "-m", "analysis", "runs", str(runs), "--no-traces"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "orphan: failed (launcher killed): run.json still says running" in out.stdout


@pytest.mark.integration
def test_tune_stopped_by_sigterm_says_interrupted(tmp_path):
    """tune.json stayed `running` after SIGTERM."""
    cmd = [sys.executable, "-m", "workloads.tools.tune", "--model", "mlp", "--dataset", "synthetic"]
    cmd += ["--batch-size", "16", "--nproc", "2", "--backend", "gloo", "--trials", "1"]
    cmd += ["--candidates", "bucket-1", "--tune-id", "t", "--no-progress"]
    cmd += ["--runs-dir", str(tmp_path), "--max-steps", "100000", "--threads", "1"]
    tuner = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    tune_json = tmp_path / "t" / "tune.json"
    try:
        # A trial is under way once its run folder has a heartbeat.
        assert _poll(lambda: list(tmp_path.glob("t/*/logs/rank*.heartbeat.json")), timeout=180)
        job = psutil.Process(tuner.pid).children(recursive=True)  # the trial's launcher and ranks
        tuner.send_signal(signal.SIGTERM)
        output = tuner.communicate(timeout=120)[0].decode()
    finally:
        if tuner.poll() is None:
            tuner.kill()
    record = json.loads(tune_json.read_text())
    assert record["status"] == "interrupted", output
    assert record["stop_reason"] == "interrupted (SIGTERM)" and record["finished_at"]
    assert tuner.returncode == 130
    # every process of the tune job is gone (other tests' unreaped children are not its own)
    assert not psutil.wait_procs(job, timeout=30)[1]


ATEXIT = textwrap.dedent(
    """
    import sys, torch
    from torch import nn
    from profiler import RunRecorder
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = RunRecorder(runs_dir=sys.argv[1], run_id="unclosed", model=model, warmup_steps=0)
    for _ in range(3):
        with rec.step():
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
    # never closed: the interpreter's exit must still write the run folder
    """
)


@pytest.mark.integration
def test_a_recorder_never_closed_is_written_at_exit(tmp_path):
    """A RunRecorder that is never closed left nothing on disk."""
    script = tmp_path / "train.py"
    script.write_text(ATEXIT)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs")],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    run = read_run(tmp_path / "runs" / "unclosed")
    assert run["status"] == "ok"
    assert any("never closed" in w for w in run["warnings"])
    rows = (tmp_path / "runs" / "unclosed" / "steps.csv").read_text().splitlines()
    assert len(rows) == 1 + 3  # the header and the three steps
