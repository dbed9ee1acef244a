"""Issue 15: `make profile-sweep` — every combination the machine can run, skipped records for the
rest, a sweep_id on every run, and a re-run that finishes only what is not yet `ok`.
Real launcher runs (torchrun/gloo) on CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, in_repo, read_run
from workloads.tools import sweep

FAST = "--model mlp --dataset synthetic --max-steps 4 --batch-size 32 --no-profile --device cpu"


def _sweep(args: list[str], runs, capsys) -> tuple[int, str]:
    """`python -m workloads.tools.sweep ARGS` in this process (each run is still a real launcher
    process); its exit code and stdout."""
    code = sweep.main([*args, "--runs-dir", str(runs), *FAST.split()])
    return code, capsys.readouterr().out


def test_combinations_include_ddp_at_world_one_and_one_single_per_seed():
    todo = sweep.combos(["single", "dp", "ddp"], ["nccl", "gloo"], [1, 2], [0, 1])
    ids = [c.run_id("s") for c in todo]
    assert len(ids) == len(set(ids)) == 2 * (1 + 2 + 2 * 2)
    assert "s-ddp-gloo-n1-s0" in ids and "s-single-n1-s1" in ids
    assert not any(c.mode == "single" and c.nproc != 1 for c in todo)


@pytest.mark.integration
def test_sweep_runs_skips_and_resumes(tmp_path, capsys, monkeypatch):
    """From a folder outside the repository with a relative RUNS (as a user runs it): the runs
    land there, every launcher child started in that folder, nothing written into the repo."""
    monkeypatch.chdir(tmp_path)
    args = ["--nprocs", "1", "--modes", "single ddp", "--backends", "gloo nccl", "--sweep", "t"]
    code, _ = _sweep(args, "out/sw", capsys)
    assert code == 0
    runs = tmp_path / "out" / "sw"
    assert (runs / ".t.log").is_file()
    assert not in_repo("t-single-n1-s0", ".t.log")
    status = {p.name: read_run(p)["status"] for p in runs.iterdir() if p.is_dir()}
    assert status == {
        "t-single-n1-s0": "ok",
        "t-ddp-gloo-n1-s0": "ok",
        "t-ddp-nccl-n1-s0": "skipped",
    }
    for name in status:
        assert read_run(runs / name)["config"]["sweep_id"] == "t"
    assert "--backend nccl needs CUDA" in read_run(runs / "t-ddp-nccl-n1-s0")["error"]["message"]

    # An interrupted sweep: one run left `failed`. The re-run keeps the ok one untouched, moves
    # the failed attempt aside (not deleted) and runs it again.
    ok_record = (runs / "t-ddp-gloo-n1-s0" / "run.json").read_text()
    failed = runs / "t-single-n1-s0" / "run.json"
    failed.write_text(json.dumps({**json.loads(failed.read_text()), "status": "failed"}))
    code, out = _sweep(args, runs, capsys)
    assert code == 0
    assert "1 done earlier" in out
    assert (runs / "t-ddp-gloo-n1-s0" / "run.json").read_text() == ok_record
    assert read_run(runs / "t-single-n1-s0")["status"] == "ok"
    (moved,) = (runs / ".replaced").iterdir()
    assert moved.name.startswith("t-single-n1-s0-") and read_run(moved)["status"] == "failed"


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--nprocs", ""], "NPROCS is empty"),
        (["--nprocs", "0 2"], "NPROCS values must be >= 1"),
        (["--nprocs", "two"], "NPROCS must be whole numbers"),
        (["--modes", "single hsdp"], "MODES: unknown hsdp"),
        (["--sweep", "../escape"], "is not a safe folder name"),
        (["--sweep", "a b"], "is not a safe folder name"),
    ],
)
def test_bad_sweep_arguments_get_one_line(tmp_path, capsys, args, match):
    assert sweep.main([*args, "--runs-dir", str(tmp_path / "runs"), *FAST.split()]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err
    assert not (tmp_path / "runs").exists()  # refused before anything was written


@pytest.mark.integration
def test_make_profile_sweep_with_empty_nprocs_is_one_line(tmp_path):
    proc = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-s",
            "-o",
            ".venv/.requirements.stamp",
            f"PY={sys.executable}",
            "profile-sweep",
            "NPROCS=",
            f"RUNS={tmp_path}",
        ],  # fmt: skip
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "NPROCS is empty" in proc.stderr
    assert "Traceback" not in proc.stderr
