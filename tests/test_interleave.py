"""Modes and world sizes interleaved over seeds (issue 26): drift hits every arm alike."""

from __future__ import annotations

import json
import sys

import pytest

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
    """`make profile-all SEEDS="0 1"` starts `dpscope profile --mode all` once per seed, in
    order: with --mode all running single, DP and DDP in that order within each launch
    (test_launch's --mode all tests check the created_at order of real runs), the runs alternate
    single and DDP seed by seed. PY is replaced by a script that prints its arguments, so make
    and the shell really run the recipe (setup is taken as done)."""
    argv = tmp_path / "argv.py"
    argv.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    argv.chmod(0o755)
    args = ["make", "-s", "--no-print-directory", "-o", ".venv/.requirements.stamp",
            f"PY={argv}", "profile-all", "SEEDS=0 1", "MODEL=mlp", "STEPS=3",
            "BATCH=16", "NPROC=2", f"RUNS={tmp_path}", "ARGS=--no-profile --threads 1"]  # fmt: skip
    proc = run_in_repo(args, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    calls = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [c[:5] for c in calls] == [["-m", "workloads.tools.cli", "profile", "--mode", "all"]] * 2
    assert [c[c.index("--seed") + 1] for c in calls] == ["0", "1"]
    seedless = [c[: c.index("--seed")] + c[c.index("--seed") + 2 :] for c in calls]
    assert seedless[0] == seedless[1]  # the rest of each seed's command line is alike
    assert seedless[0][-3:] == ["--no-profile", "--threads", "1"] and "--nproc" in seedless[0]


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
