"""Issue 2: the launcher. Clear one-line errors, crash records, multi-node and file:// rendezvous,
`--mode all` with skipped modes. Real torchrun processes on CPU (gloo)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from analysis.runs.compare import compare_runs
from tests.conftest import REPO, free_port, launch, read_run, run_in_repo
from workloads.launch import launcher as launcher
from workloads.train.loop import main as train_main

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
@pytest.mark.integration
def test_impossible_modes_fail_with_one_line(tmp_path, args, match):
    proc = launch([*args, "--runs-dir", str(tmp_path), *FAST], check=False)
    assert proc.returncode == 2
    assert match in _one_clean_line(proc.stderr)
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_nccl_on_windows_is_refused(monkeypatch, capsys, tmp_path):
    """The launcher plans with the machine it sees (workloads.plan; the layouts are in test_plan)."""
    monkeypatch.setattr(platform, "system", lambda: "Windows")
    rc = launcher.main(["--mode", "ddp", "--backend", "nccl", "--runs-dir", str(tmp_path), *FAST])
    assert rc == 2
    assert "NCCL is not available on Windows" in _one_clean_line(capsys.readouterr().err)


def test_cpu_nproc_above_cores_warns(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    monkeypatch.setattr(launcher, "_execute", lambda *_: "ok")
    args = ["--mode", "ddp", "--nproc", "3", "--runs-dir", str(tmp_path), *FAST]
    assert launcher.main([*args, "--batch-size", "48"]) == 0
    assert "--nproc 3 exceeds the 2 CPU cores" in capsys.readouterr().err


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
        (["--lr", "-1"], "--lr must be a finite number in [0,"),
        (["--mode", "ddp", "--nproc", "0"], "--nproc must be >= 1; got 0"),  # make NPROC=0
        (["--mode", "all", "--nproc", "0"], "--nproc must be >= 1; got 0"),
        (["--profile-active", "0"], "--profile-active must be >= 1; got 0"),  # PROF_ACTIVE=0
        (["--mode", "all", "--profile-wait", "-1"], "--profile-wait must be >= 0; got -1"),
    ],
)
def test_bad_arguments_fail_with_one_line(tmp_path, capsys, args, match):
    """Refused before anything is written: no runs folder, no run folder, no skipped record."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert launcher.main([*FAST, *args, "--runs-dir", str(tmp_path / "runs")]) == 2
    assert match in _one_clean_line(capsys.readouterr().err)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("where", ["file", "file/runs"])
def test_runs_dir_that_is_a_file_is_one_line(tmp_path, capsys, where):
    """make RUNS=<an existing file>: one line naming it, not a NotADirectoryError traceback."""
    (tmp_path / "file").write_text("not a folder")
    assert launcher.main([*FAST, "--runs-dir", str(tmp_path / where)]) == 2
    line = _one_clean_line(capsys.readouterr().err)
    assert f"{tmp_path / 'file'} is a file, not a folder" in line


@pytest.mark.parametrize("module", ["workloads.launch", "workloads.train"])
@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--backend", "mpi"], "argument --backend: invalid choice: 'mpi'"),  # BACKEND=
        (["--seed", "0,1"], "argument --seed: invalid int value: '0,1'"),  # SEEDS="0,1"
        (["--max-steps", "ten"], "argument --max-steps: invalid int value: 'ten'"),  # STEPS=
    ],
)
def test_bad_choices_are_one_line_not_the_usage_block(capsys, module, args, match):
    main = launcher.main if module == "workloads.launch" else train_main
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    line = _one_clean_line(capsys.readouterr().err)
    assert line.startswith(f"python -m {module}: error: ") and match in line


@pytest.mark.integration
def test_make_passes_runs_with_a_space_as_one_folder(tmp_path):
    """RUNS="dir with space" reaches every target's command as one argument; `make report`
    still takes several folders. PY is replaced by a script that prints its arguments, so make
    and the shell really run each recipe (setup is taken as done)."""
    argv = tmp_path / "argv.py"
    argv.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    argv.chmod(0o755)
    runs = tmp_path / "dir with space"
    runs.mkdir()
    targets = ["profile-single", "profile-dp", "profile-ddp", "profile-all", "report"]

    def make(*args: str) -> list[list[str]]:
        proc = run_in_repo(["make", "-s", "-o", ".venv/.requirements.stamp", f"PY={argv}", *args])
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stdout.splitlines()]

    calls = make(*targets, "tensorboard", "gpu-check", f"RUNS={runs}")
    assert len(calls) == len(targets) + 2
    assert all(str(runs) in c or f"{runs}/gpu-check" in c for c in calls), calls
    other = tmp_path / "other"
    (report,) = make("report", f"RUNS={runs.parent / 'a'} {other}")
    assert report[:4] == ["-m", "workloads.tools.cli", "report", str(runs.parent / "a")]
    assert str(other) in report


# --- real runs -------------------------------------------------------------------------------


def test_a_crashing_rank_marks_the_run_failed(fresh_golden):
    """The golden failed run made now: DDP, rank 1 raises at step 2 (DPSCOPE_FAIL_RANK)."""
    run = read_run(fresh_golden("failed-ddp-mlp"))  # the launcher exited with 1 (make_run)
    assert run["status"] == "failed"
    err = run["error"]
    assert (err["rank"], err["exit_code"]) == (1, 1)
    assert "rank 1 failed" in err["message"] and "injected failure on rank 1" in err["message"]
    assert any("RuntimeError: injected failure" in line for line in err["log_tail"])
    assert run["config"]["world_size"] == 2  # the launcher's record survives the crash
    assert "status: failed" in fresh_golden.output("failed-ddp-mlp")


def _two_nodes(runs: Path) -> list[subprocess.CompletedProcess]:
    """Two launchers, one per node, one rank each, rendezvous on a loopback port."""
    endpoint = f"127.0.0.1:{free_port()}"
    ddp = "-m workloads.launch --mode ddp --backend gloo --nproc 1 --nnodes 2 --run-id two-nodes"
    procs = [
        subprocess.Popen(
            [sys.executable, *ddp.split(), "--node-rank", str(node), "--rdzv-endpoint", endpoint]
            + ["--runs-dir", str(runs), *FAST],
            cwd=REPO,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    return [
        subprocess.CompletedProcess(p.args, p.returncode, out, "")
        for p, out in zip(procs, outs, strict=True)
    ]


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict[str, tuple[Path, list[subprocess.CompletedProcess]]]:
    """The real launches of this module, started at once (each mostly waits on one core: two
    cores finish them sooner together), each into its own runs folder: {name: (runs folder,
    the finished launcher processes)}. `--mode all` only on a CPU-only machine."""
    runs = {n: tmp_path_factory.mktemp(n) for n in ("two-nodes", "file-rdzv", "all-2", "all-3")}

    def mode_all(name: str, nproc: int) -> list[subprocess.CompletedProcess]:
        args = ["--mode", "all", "--nproc", str(nproc), "--runs-dir", str(runs[name]), *FAST]
        return [launch(args, check=False)]

    rdzv = ["--mode", "ddp", "--backend", "gloo", "--nproc", "2", "--run-id", "file-rdzv"]
    rdzv += ["--rdzv-file", str(runs["file-rdzv"] / "rdzv" / "store")]
    jobs = {
        "two-nodes": lambda: _two_nodes(runs["two-nodes"]),
        "file-rdzv": lambda: [launch([*rdzv, "--runs-dir", str(runs["file-rdzv"]), *FAST])],
    }
    if not torch.cuda.is_available():
        jobs |= {"all-2": lambda: mode_all("all-2", 2), "all-3": lambda: mode_all("all-3", 3)}
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
    return {name: (runs[name], future.result()) for name, future in futures.items()}


@pytest.mark.integration
def test_two_nodes_on_loopback(launched):
    runs, procs = launched["two-nodes"]
    outs = [p.stdout for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
    run = read_run(runs / "two-nodes")
    assert run["status"] == "ok"
    cfg = run["config"]
    assert (cfg["nnodes"], cfg["nproc_per_node"], cfg["world_size"]) == (2, 1, 2)
    assert [p["rank"] for p in run["metrics"]["per_rank"]] == [0, 1]
    assert "node 0 writes" in outs[1]


@pytest.mark.integration
def test_file_rendezvous(launched):
    runs, _ = launched["file-rdzv"]
    run = read_run(runs / "file-rdzv")
    assert run["status"] == "ok" and run["config"]["rendezvous"] == "file"
    assert "--init-method file://" in (runs / "file-rdzv" / "logs" / "launcher.log").read_text()


ALL = (("single", "none"), ("dp", "none"), ("ddp", "nccl"), ("ddp", "gloo"))


def _mode_all(launched, name: str) -> tuple[subprocess.CompletedProcess, dict, tuple]:
    """The `--mode all` launch `name`; return the process, {(mode, backend): run.json} of every
    run folder it wrote, and the statuses in ALL's order."""
    runs_dir, (proc,) = launched[name]
    assert proc.returncode == 0, f"launcher failed\n{proc.stdout}\n{proc.stderr}"
    runs = {
        (r["config"]["mode"], r["config"]["backend"]): r
        for r in (read_run(d) for d in runs_dir.iterdir())
    }
    assert set(runs) == set(ALL)
    # Made in ALL's order: each seed of `make profile-all` runs single, then DP, then DDP
    # (test_interleave: the seeds in turn), so drift hits every mode alike.
    made = sorted(runs, key=lambda k: (runs[k]["created_at"], ALL.index(k)))
    assert made == list(ALL), made
    return proc, runs, tuple(runs[k]["status"] for k in ALL)


@pytest.mark.skipif(torch.cuda.is_available(), reason="expects a CPU-only machine")
@pytest.mark.integration
def test_mode_all_runs_what_it_can_and_skips_the_rest(launched):
    proc, runs, statuses = _mode_all(launched, "all-2")
    assert statuses == ("ok", "skipped", "skipped", "ok")
    assert "CUDA" in runs[("dp", "none")]["error"]["message"]
    assert "nccl" in runs[("ddp", "nccl")]["error"]["message"]
    assert runs[("ddp", "nccl")]["metrics"] == {}
    # A skipped run has no layout: null devices and batch, not a half-built plan; the request
    # (2 processes) is kept where it was given.
    for key in (("dp", "none"), ("ddp", "nccl")):
        config = runs[key]["config"]
        layout = (config["devices"], config["global_batch"], config["per_device_batch"])
        assert layout == (None, None, None) and runs[key]["env"]["threads_per_rank"] is None
    assert runs[("ddp", "nccl")]["config"]["world_size"] == 2
    assert runs[("ddp", "gloo")]["config"]["per_device_batch"] == 16
    assert "make report" in proc.stdout
    # The analysis reads those null layouts as skipped runs, not as invalid records.
    data = compare_runs([launched["all-2"][0]], progress=False, traces=False)
    assert not data["invalid"]
    assert sorted(r["status"] for r in data["runs"]) == ["ok", "ok", "skipped", "skipped"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="expects a CPU-only machine")
@pytest.mark.integration
def test_mode_all_skips_a_mode_whose_batch_does_not_divide(launched):
    """3 DDP ranks cannot share a global batch of 32: that mode is recorded as skipped with the
    reason, and the others still run (single here; dp/nccl need CUDA)."""
    proc, runs, statuses = _mode_all(launched, "all-3")
    assert statuses == ("ok", "skipped", "skipped", "skipped")
    assert "not divisible by 3" in runs[("ddp", "gloo")]["error"]["message"]
    assert proc.returncode == 0
