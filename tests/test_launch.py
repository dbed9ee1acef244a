"""Issue 2: the launcher. Clear one-line errors, crash records, multi-node and file:// rendezvous,
`--mode all` with skipped modes. Real torchrun processes on CPU (gloo)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO, launch, read_run
from workloads import launch as launcher

FAST = "--model mlp --dataset synthetic --max-steps 4 --batch-size 32 --epochs 1 --no-profile --device cpu".split()


def _one_clean_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


# --- clear errors: real subprocesses where this machine is the case, patched otherwise --------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA messages")
@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--mode", "ddp", "--backend", "nccl"], "--backend nccl needs CUDA GPUs"),
        (["--mode", "dp"], "--mode dp needs at least one CUDA device"),
    ],
)
def test_impossible_modes_fail_with_one_line(tmp_path, args, match):
    proc = launch([*args, "--runs-dir", str(tmp_path), *FAST], check=False)
    assert proc.returncode == 2
    assert match in _one_clean_line(proc.stderr)
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_nccl_on_windows_is_refused(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(platform, "system", lambda: "Windows")
    with pytest.raises(launcher.LaunchError, match="NCCL is not available on Windows"):
        launcher.validate("ddp", "nccl", nproc=2)
    # auto picks gloo there, even with GPUs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert launcher.validate("ddp", "auto", nproc=2).backend == "gloo"
    rc = launcher.main(["--mode", "ddp", "--backend", "nccl", "--runs-dir", str(tmp_path), *FAST])
    assert rc == 2
    assert "NCCL is not available on Windows" in _one_clean_line(capsys.readouterr().err)


def test_nproc_above_gpu_count_is_refused(monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert launcher.validate("ddp", "auto", nproc=1).backend == "nccl"
    for backend in ("nccl", "gloo"):
        with pytest.raises(launcher.LaunchError, match="--nproc 2 is above the 1 visible GPU"):
            launcher.validate("ddp", backend, nproc=2)
    with pytest.raises(launcher.LaunchError, match="--nproc 3 is above the 1 visible GPU"):
        launcher.validate("dp", "auto", nproc=3)


def test_cpu_nproc_above_cores_warns_and_sync_bn_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(launcher, "cpu_cores", lambda: 2)
    plan = launcher.validate("ddp", "auto", nproc=3)
    assert (plan.backend, plan.threads_per_rank) == ("gloo", 1)
    assert "--nproc 3 exceeds the 2 CPU cores" in capsys.readouterr().err
    with pytest.raises(launcher.LaunchError, match="--sync-bn needs CUDA"):
        launcher.validate("ddp", "gloo", nproc=2, sync_bn=True)


@pytest.mark.parametrize(
    ("args", "gpus"),
    [
        (["--mode", "dp", "--nproc", "2"], 2),
        (["--mode", "dp", "--dp-gpus", "3", "--batch-size", "48"], 3),
    ],
)
def test_dp_gpu_count_reaches_train(monkeypatch, tmp_path, args, gpus):
    """The GPUs the DP plan records are the GPUs train is told to use (not every visible one).
    Validation and the command line only: nothing runs, so a faked 4-GPU machine is enough."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    seen = []
    monkeypatch.setattr(launcher, "_execute", lambda cfg, plan, *_: seen.append((cfg, plan)))
    cpu_free = [a for a in FAST if a not in ("--device", "cpu")]
    assert launcher.main(["--runs-dir", str(tmp_path), *cpu_free, *args]) == 0
    ((cfg, plan),) = seen
    assert plan.devices == [f"cuda:{i}" for i in range(gpus)] and plan.replicas == gpus
    argv = launcher.to_argv(cfg)
    assert argv[argv.index("--dp-gpus") + 1] == str(gpus)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--dataset", "cifar10", "--data-dir", "{tmp}/nothing"], "cifar10 not found at"),
        (["--mode", "ddp", "--nproc", "2", "--batch-size", "33"], "not divisible by 2"),
        (["--mode", "all", "--run-id", "x"], "--mode all makes four"),
        (["--mode", "ddp", "--nnodes", "2"], "--rdzv-endpoint"),
        (["--lr", "-1"], "--lr must be >= 0"),
    ],
)
def test_bad_arguments_fail_with_one_line(tmp_path, capsys, args, match):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert launcher.main([*FAST, *args, "--runs-dir", str(tmp_path / "runs")]) == 2
    assert match in _one_clean_line(capsys.readouterr().err)


# --- real runs -------------------------------------------------------------------------------


def test_a_crashing_rank_marks_the_run_failed(runs_dir, monkeypatch):
    monkeypatch.setenv("DPSCOPE_FAIL_RANK", "1")
    monkeypatch.setenv("DPSCOPE_FAIL_STEP", "2")
    proc = launch(
        [
            "--mode",
            "ddp",
            "--nproc",
            "2",
            "--backend",
            "gloo",
            "--run-id",
            "crash",
            "--runs-dir",
            str(runs_dir),
            *FAST,
        ],
        check=False,
    )
    assert proc.returncode == 1
    run = read_run(runs_dir / "crash")
    assert run["status"] == "failed"
    err = run["error"]
    assert (err["rank"], err["exit_code"]) == (1, 1)
    assert "rank 1 failed" in err["message"] and "injected failure on rank 1" in err["message"]
    assert any("RuntimeError: injected failure" in line for line in err["log_tail"])
    assert run["config"]["world_size"] == 2  # the launcher's record survives the crash
    assert "status: failed" in proc.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_loopback(runs_dir):
    endpoint = f"127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workloads.launch",
                "--mode",
                "ddp",
                "--backend",
                "gloo",
                "--nproc",
                "1",
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--rdzv-endpoint",
                endpoint,
                "--run-id",
                "two-nodes",
                "--runs-dir",
                str(runs_dir),
                *FAST,
            ],
            cwd=REPO,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
    run = read_run(runs_dir / "two-nodes")
    assert run["status"] == "ok"
    cfg = run["config"]
    assert (cfg["nnodes"], cfg["nproc_per_node"], cfg["world_size"]) == (2, 1, 2)
    assert [p["rank"] for p in run["metrics"]["per_rank"]] == [0, 1]
    assert "node 0 writes" in outs[1]


def test_file_rendezvous(runs_dir, tmp_path):
    rdzv = tmp_path / "rdzv" / "store"
    launch(
        [
            "--mode",
            "ddp",
            "--backend",
            "gloo",
            "--nproc",
            "2",
            "--rdzv-file",
            str(rdzv),
            "--run-id",
            "file-rdzv",
            "--runs-dir",
            str(runs_dir),
            *FAST,
        ]
    )
    run = read_run(runs_dir / "file-rdzv")
    assert run["status"] == "ok" and run["config"]["rendezvous"] == "file"
    assert "--init-method file://" in (runs_dir / "file-rdzv" / "logs" / "launcher.log").read_text()


def _runs_by_mode(runs_dir) -> dict:
    """{(mode, backend): run.json} of every run folder under `runs_dir`."""
    return {
        (r["config"]["mode"], r["config"]["backend"]): r
        for r in (read_run(d) for d in runs_dir.iterdir())
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="expects a CPU-only machine")
def test_mode_all_runs_what_it_can_and_skips_the_rest(tmp_path):
    proc = launch(["--mode", "all", "--nproc", "2", "--runs-dir", str(tmp_path), *FAST])
    runs = _runs_by_mode(tmp_path)
    assert {k: r["status"] for k, r in runs.items()} == {
        ("single", "none"): "ok",
        ("dp", "none"): "skipped",
        ("ddp", "nccl"): "skipped",
        ("ddp", "gloo"): "ok",
    }
    assert "CUDA" in runs[("dp", "none")]["error"]["message"]
    assert "nccl" in runs[("ddp", "nccl")]["error"]["message"]
    assert runs[("ddp", "nccl")]["metrics"] == {}
    assert "make report" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="expects a CPU-only machine")
def test_mode_all_skips_a_mode_whose_batch_does_not_divide(tmp_path):
    """3 DDP ranks cannot share a global batch of 32: that mode is recorded as skipped with the
    reason, and the others still run (single here; dp/nccl need CUDA)."""
    proc = launch(["--mode", "all", "--nproc", "3", "--runs-dir", str(tmp_path), *FAST])
    runs = _runs_by_mode(tmp_path)
    assert {k: r["status"] for k, r in runs.items()} == {
        ("single", "none"): "ok",
        ("dp", "none"): "skipped",
        ("ddp", "nccl"): "skipped",
        ("ddp", "gloo"): "skipped",
    }
    assert "not divisible by 3" in runs[("ddp", "gloo")]["error"]["message"]
    assert proc.returncode == 0
