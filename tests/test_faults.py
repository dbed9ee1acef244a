"""Runs that survive faults and say what went wrong (issue 12), with real torchrun/gloo processes.

Faults are injected with the trainer's test hooks (DPSCOPE_KILL_*, DPSCOPE_HANG_*,
DPSCOPE_NAN_STEP); every wait is bounded by a subprocess timeout.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from analysis.trace.folder import analyze_trace_dir
from tests.conftest import REPO, read_run
from workloads.launch.faults import NonFiniteLoss, classify
from workloads.launch.heartbeat import read_heartbeats
from workloads.launch.runlog import finalize
from workloads.launch.supervise import Outcome

# serial: its hang and restart bounds time the launcher's watchdog.
pytestmark = pytest.mark.serial

DDP = "--mode ddp --nproc 2 --backend gloo --model mlp --dataset synthetic --batch-size 64".split()
CPU = ["--device", "cpu", "--seed", "0"]


def _resumed_specs(runs_dir: Path) -> dict[str, tuple[dict, list[str]]]:
    """DDP (2 ranks, MLP): rank 1 SIGKILLs itself at step 12 with --max-restarts 1
    --checkpoint-every 5, and the same run uninterrupted. The profiler window (steps 10-12) is
    cut by the kill in attempt 0, so only the restarted attempt writes traces."""
    common = [
        *DDP,
        *CPU,
        "--runs-dir",
        str(runs_dir),
        "--max-steps",
        "16",
        "--checkpoint-every",
        "5",
        "--save-final",
        "--max-restarts",
        "1",
        *"--profile-wait 9 --profile-warmup 1 --profile-active 3".split(),
    ]
    kill = {"DPSCOPE_KILL_RANK": "1", "DPSCOPE_KILL_STEP": "12"}
    return {
        "fault-resumed": (kill, [*common, "--run-id", "fault-resumed"]),
        "fault-clean": ({}, [*common, "--run-id", "fault-clean", "--no-profile"]),
    }


@pytest.fixture(scope="module")
def fault_runs(runs_dir: Path) -> dict[str, tuple[int, float]]:
    """The resumed pair and the FAILING runs, all started together (a hang or a restart mostly
    waits): {run_id: (launcher exit code, seconds it took)}."""
    common = [*DDP, *CPU, "--runs-dir", str(runs_dir), "--no-profile"]
    others = {
        rid: (hooks, [*common, "--run-id", rid, *extra])
        for rid, (hooks, extra) in {**FAILING, **SLOW}.items()
    }
    return _run_together({**_resumed_specs(runs_dir), **others}, timeout=300)


@pytest.fixture(scope="module")
def resumed_runs(runs_dir: Path, fault_runs) -> tuple[Path, Path]:
    """(the killed-and-resumed run, the same run uninterrupted): _resumed_specs."""
    codes = {rid: fault_runs[rid][0] for rid in ("fault-resumed", "fault-clean")}
    assert codes == {"fault-resumed": 0, "fault-clean": 0}
    return runs_dir / "fault-resumed", runs_dir / "fault-clean"


@pytest.mark.integration
def test_a_killed_rank_is_restarted_and_resumes_exactly(resumed_runs):
    resumed, clean = resumed_runs
    rec = read_run(resumed)
    assert rec["status"] == "ok" and rec["error"] is None
    assert rec["restarts"] == 1
    assert rec["resumes"] == [{"attempt": 1, "resumed_from_step": 10}]
    assert "SIGKILL at step 12" in (resumed / "logs" / "rank1.log").read_text()
    a = torch.load(resumed / "final.pt", weights_only=True)
    b = torch.load(clean / "final.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6, rtol=0), k
    # Each (rank, step) once: steps < 10 from attempt 0 (saved in the checkpoint), the rest
    # from attempt 1, with the same losses as the uninterrupted run.
    import pandas as pd

    steps, ref = pd.read_csv(resumed / "steps.csv"), pd.read_csv(clean / "steps.csv")
    assert not steps.duplicated(["rank", "step"]).any()
    assert sorted(steps["step"].unique()) == list(range(16)) and len(steps) == 32
    assert (steps["loss"] - ref["loss"]).abs().max() < 1e-6


@pytest.mark.integration
def test_restarted_traces_have_own_names_and_steps_count_once(resumed_runs, tmp_path):
    resumed, _ = resumed_runs
    names = sorted(Path(t).name for t in read_run(resumed)["traces"])
    assert len(names) == 2 and all(
        n.startswith(("rank0_attempt1.", "rank1_attempt1.")) for n in names
    )
    trace = analyze_trace_dir(resumed / "traces", progress=False)
    assert [r["rank"] for r in trace["ranks"]] == [0, 1]
    for r in trace["ranks"]:  # ProfilerStep numbers follow the run's global steps (10-12;
        assert r["step_numbers"] == [10, 11]  # the analysis drops the last, as HTA does)
    # Next to an attempt-0 set of traces, only one attempt is analysed: no step counts twice.
    mixed = tmp_path / "mixed"
    shutil.copytree(resumed / "traces", mixed)
    for t in read_run(resumed)["traces"]:
        name = Path(t).name.replace("_attempt1.", ".")
        shutil.copy(resumed / t, mixed / name)
    out = analyze_trace_dir(mixed, progress=False)
    assert [Path(r["file"]).name.split(".")[0] for r in out["ranks"]] == [
        "rank0_attempt1",
        "rank1_attempt1",
    ]
    assert len(out["skipped"]) == 2
    assert all("restart attempt 0" in s["reason"] for s in out["skipped"])


# Failing runs started together (they mostly wait): {run_id: (hooks, launcher args)}.
FAILING = {
    "fault-killed": ({"DPSCOPE_KILL_RANK": "1", "DPSCOPE_KILL_STEP": "2"}, ["--max-steps", "6"]),
    "fault-nan": ({"DPSCOPE_NAN_STEP": "3"}, ["--max-steps", "6"]),
    # No collective to time out: only the launcher's watchdog can see this one (5 s + 10 s).
    "fault-hang-single": (
        {"DPSCOPE_HANG_RANK": "0", "DPSCOPE_HANG_STEP": "2"},
        ["--mode", "single", "--max-steps", "6", "--collective-timeout", "5"],
    ),
}

# A set-up that takes longer than the watchdog's 2 s + 10 s: not a hang (its start-up bound).
SLOW = {
    "fault-slow-start": (
        {"DPSCOPE_START_DELAY_S": "20"},
        ["--mode", "single", "--max-steps", "3", "--collective-timeout", "2"],
    ),
}


def _run_together(runs: dict[str, tuple[dict, list[str]]], *, timeout: float) -> dict:
    """Start one launcher per {run_id: (hook env, args)} at once (a hang or a restart mostly
    waits); return {run_id: (exit code, seconds it took)}. Every wait is bounded by `timeout`."""
    procs = {}
    for run_id, (hooks, args) in runs.items():
        procs[run_id] = (
            subprocess.Popen(
                [sys.executable, "-m", "workloads.launch", *args],
                cwd=REPO,
                env=dict(os.environ, PYTHONUNBUFFERED="1", **hooks),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            time.monotonic(),
        )
    out = {}
    try:
        for run_id, (proc, start) in procs.items():
            code = proc.wait(timeout=max(1.0, start + timeout - time.monotonic()))
            out[run_id] = (code, time.monotonic() - start)
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
    return out


@pytest.fixture(scope="module")
def failed_runs(fault_runs) -> dict[str, tuple[int, float]]:
    """{run_id: (launcher exit code, seconds it took)} of the FAILING runs (fault_runs)."""
    return {rid: fault_runs[rid] for rid in FAILING}


def test_a_hung_rank_is_named_within_bounded_time(runs_dir):
    hooks = {"DPSCOPE_HANG_RANK": "1", "DPSCOPE_HANG_STEP": "3"}
    args = [*DDP, *CPU, "--runs-dir", str(runs_dir), "--no-profile", "--run-id", "fault-hang"]
    args += ["--max-steps", "8", "--collective-timeout", "8"]
    # Alone, so that the bound measures this launcher, not its neighbours; generous (the 8 s
    # collective timeout plus start-up and the launcher's grace), so a loaded machine passes.
    code, seconds = _run_together({"fault-hang": (hooks, args)}, timeout=180)["fault-hang"]
    assert code == 1 and seconds < 180
    rec = read_run(runs_dir / "fault-hang")
    err = rec["error"]
    assert rec["status"] == "failed"
    assert err["kind"] == "hang" and err["rank"] == 1 and err["step"] == 3
    assert err["phase"] == "forward"  # it hung before its backward
    assert err["collective"] == "allreduce (DDP gradient buckets)"
    assert [w["rank"] for w in err["waiting"]] == [0]
    assert "rank 1 stopped progressing at step 3" in err["message"]
    beat = json.loads((runs_dir / "fault-hang" / "logs" / "rank0.heartbeat.json").read_text())
    assert beat["collective_started"]["seq"] == beat["collective_finished"]["seq"] + 1
    # The flight recorder names the collective by its sequence number: rank 0 entered the
    # gradient all_reduce after rank 1's last one, and waited in it for the timeout.
    fr = err["flight_recorder"]
    logs = runs_dir / "fault-hang" / "logs"
    last = {
        r: max(
            e["collective_seq_id"]
            for e in json.loads((logs / f"rank{r}.flightrec.json").read_text())["trace"]["entries"]
        )
        for r in (0, 1)
    }
    assert (fr["collective"], fr["seq"], fr["entered"], fr["never_entered"]) == (
        "all_reduce",
        last[0],
        [0],
        [1],
    )
    assert last[1] == last[0] - 1 and 7 <= fr["waited_s"]["0"] < 60
    assert err["message"].startswith(f"rank 1 never entered all_reduce #{last[0]} (rank 0 waited ")
    assert "; its last phase: forward, step 3 — " in err["message"]


def test_the_watchdog_ends_a_hang_outside_any_collective(runs_dir, failed_runs):
    code, seconds = failed_runs["fault-hang-single"]
    assert code == 1
    err = read_run(runs_dir / "fault-hang-single")["error"]
    assert err["kind"] == "hang" and err["rank"] == 0 and err["step"] == 2
    assert err["phase"] == "forward" and err["waiting"] == []
    assert err["exit_code"] == -15  # the watchdog stopped it


def test_a_slow_set_up_is_not_a_hang(runs_dir, fault_runs):
    code, seconds = fault_runs["fault-slow-start"]
    rec = read_run(runs_dir / "fault-slow-start")
    assert (code, rec["status"], rec["error"]) == (0, "ok", None), rec["error"]
    assert seconds > 20  # it did sleep past the 12 s a stall is allowed once training runs
    assert (
        "DPSCOPE_START_DELAY_S test hook"
        in (runs_dir / "fault-slow-start" / "logs" / "rank0.log").read_text()
    )


def test_a_killed_rank_without_restarts_says_killed(runs_dir, failed_runs):
    assert failed_runs["fault-killed"][0] == 1
    rec = read_run(runs_dir / "fault-killed")
    err = rec["error"]
    assert rec["status"] == "failed" and rec["restarts"] == 0
    assert err["kind"] == "killed" and err["rank"] == 1 and err["exit_code"] == -9
    assert "SIGKILL" in err["message"] and "OOM killer" in err["message"]


def test_a_nan_loss_stops_the_run_as_diverged(runs_dir, failed_runs):
    assert failed_runs["fault-nan"][0] == 1
    err = read_run(runs_dir / "fault-nan")["error"]
    assert err["kind"] == "diverged" and err["step"] == 3 and err["value"] == "nan"
    assert "loss is nan at step 3" in err["message"]


def test_sigterm_to_the_launcher_stops_every_process(runs_dir):
    run_dir = runs_dir / "fault-interrupted"
    args = [*DDP, *CPU, "--runs-dir", str(runs_dir), "--run-id", run_dir.name, "--no-profile"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "workloads.launch", *args, "--epochs", "10000"],
        cwd=REPO,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # both ranks are training
            beats = read_heartbeats(run_dir / "logs")
            if len(beats) == 2 and all(b["step"] >= 2 for b in beats.values()):
                break
            time.sleep(0.5)
        else:
            pytest.fail("the ranks never reached step 2")
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= 3  # torchrun and its two ranks
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=90)
        assert code == 130, (code, (run_dir / "logs" / "launcher.log").read_text()[-3000:])
    finally:
        if proc.poll() is None:
            proc.kill()
    _, alive = psutil.wait_procs(tree, timeout=60)  # returns as soon as they are gone

    def running(p: psutil.Process) -> bool:  # an unreaped zombie is not running
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    assert [p for p in alive if running(p)] == []
    rec = read_run(run_dir)
    assert rec["status"] == "failed" and rec["error"]["kind"] == "interrupted"
    assert "SIGTERM" in rec["error"]["message"]


def test_a_finished_run_is_never_downgraded(ddp_mlp_run, tmp_path):
    run_dir = tmp_path / "done"
    shutil.copytree(ddp_mlp_run, run_dir)
    before = read_run(run_dir)
    log = run_dir / "logs" / "launcher.log"
    for outcome in (Outcome(-15, interrupted="SIGTERM"), Outcome(1), Outcome(1, hang={"x": 1})):
        assert finalize(run_dir, outcome, log).status == "ok"
        assert read_run(run_dir) == before
    # A run that had not finished is marked interrupted.
    (run_dir / "run.json").write_text(json.dumps({**before, "status": "running"}))
    rec = finalize(run_dir, Outcome(-15, interrupted="SIGTERM"), log)
    assert rec.status == "failed" and rec.error.kind == "interrupted"


def test_error_kinds_of_exceptions():
    oom = classify(
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"), per_device_batch=256
    )
    assert oom["kind"] == "oom" and oom["per_device_batch"] == 256
    assert "per-device batch 256" in oom["message"] and "--grad-accum-steps" in oom["message"]
    div = classify(NonFiniteLoss(rank=0, step=7, value=float("inf")), per_device_batch=8)
    assert div == {"kind": "diverged", "message": div["message"], "step": 7, "value": "inf"}
    assert classify(RuntimeError("Timed out waiting 20000ms"), per_device_batch=1)["kind"] == "hang"
    assert classify(ValueError("boom"), per_device_batch=1)["kind"] == "crash"


def test_a_half_written_trace_is_skipped_with_one_line(ddp_mlp_run, tmp_path):
    traces = tmp_path / "traces"
    shutil.copytree(ddp_mlp_run / "traces", traces)
    victim = sorted(traces.glob("rank1.*"))[0]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])  # killed mid-export: a truncated gzip
    partial = traces / "rank2.1.pt.trace.json"  # an uncompressed export cut off mid-way
    partial.write_text(gzip.decompress(data).decode()[:5000])
    out = analyze_trace_dir(traces, progress=False)
    assert [r["rank"] for r in out["ranks"]] == [0]
    reasons = {Path(s["file"]).name: s["reason"] for s in out["skipped"]}
    assert "truncated or corrupt gzip" in reasons[victim.name]
    assert "not a Kineto JSON trace" in reasons[partial.name]
    assert all("\n" not in r for r in reasons.values())


def test_the_report_lists_failed_runs_with_kind_and_one_line(runs_dir, failed_runs):
    from analysis.report.findings import findings
    from analysis.runs.compare import compare_runs
    from analysis.runs.notes import run_reason

    data = compare_runs([runs_dir / rid for rid in FAILING], progress=False, traces=False)
    reasons = {r["run_id"]: run_reason(r["error"]) for r in data["runs"]}
    assert reasons["fault-killed"].startswith("killed: rank 1 was killed by SIGKILL")
    assert reasons["fault-nan"].startswith("diverged: rank ")
    assert reasons["fault-hang-single"].startswith("hang: rank 0 stopped progressing at step 2")
    assert all("\n" not in r for r in reasons.values())
    texts = [f.text for f in findings(data) if f.rule == "run_status"]
    assert any(t.startswith("1 run is failed: diverged: ") for t in texts)
