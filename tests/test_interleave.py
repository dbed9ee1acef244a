"""Modes and world sizes interleaved over seeds (issue 26): drift hits every arm alike."""

from __future__ import annotations

import sys

import pytest

from profiler.runfolder.records import read_record
from tests.conftest import run_in_repo
from workloads.tools import sweep


def test_sweep_interleaves_world_sizes_and_modes_within_each_seed():
    todo = sweep.combos(["single", "dp", "ddp"], ["gloo"], [1, 2], [0, 1])
    assert [c.run_id("s") for c in todo] == [
        "s-single-n1-s0", "s-dp-n1-s0", "s-ddp-gloo-n1-s0", "s-dp-n2-s0", "s-ddp-gloo-n2-s0",
        "s-single-n1-s1", "s-dp-n1-s1", "s-ddp-gloo-n1-s1", "s-dp-n2-s1", "s-ddp-gloo-n2-s1",
    ]  # fmt: skip


@pytest.mark.integration
def test_make_profile_all_with_several_seeds_runs_the_modes_in_turn(tmp_path):
    """Real `make profile-all SEEDS="0 1"` (DP and NCCL skipped on CPU): the runs, in the order
    they were created, alternate single and DDP seed by seed."""
    args = ["make", "-s", "--no-print-directory", "-o", ".venv/.requirements.stamp",
            f"PY={sys.executable}", "profile-all", "SEEDS=0 1", "MODEL=mlp", "STEPS=3",
            "BATCH=16", "NPROC=2", f"RUNS={tmp_path}", "ARGS=--no-profile --threads 1"]  # fmt: skip
    proc = run_in_repo(args, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    recs = [
        read_record(p / "run.json")[0] for p in tmp_path.iterdir() if (p / "run.json").is_file()
    ]
    ok = sorted((r for r in recs if r.status == "ok"), key=lambda r: r.created_at)
    assert [(r.config.mode, r.config.seed) for r in ok] == [
        ("single", 0), ("ddp", 0), ("single", 1), ("ddp", 1),
    ]  # fmt: skip


@pytest.mark.integration  # make -n: prints the commands, runs none
def test_make_profile_all_passes_repeat_and_its_budget():
    args = [
        "make",
        "-n",
        "--no-print-directory",
        "profile-all",
        "REPEAT=auto",
        "REPEAT_BUDGET_S=90",
    ]
    out = run_in_repo(args, timeout=60).stdout
    assert "--mode all" in out and "--repeat auto --repeat-budget-s 90" in out
    assert "--repeat 1 " in run_in_repo(["make", "-n", "profile-all"], timeout=60).stdout
