"""Shared by the `--script` tests: the user's folder outside the repository with the scripts of
tests/scripts/ copied in, and the launcher started there the way a user starts it."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

SCRIPTS = REPO / "tests" / "scripts"


def user_folder(folder: Path) -> Path:
    """`folder` (outside the repository) holding a copy of every script of tests/scripts/."""
    assert not folder.resolve().is_relative_to(REPO.resolve())
    for script in SCRIPTS.glob("*.py"):
        shutil.copy(script, folder / script.name)
    return folder


def launcher_env(**extra: str) -> dict[str, str]:
    """The user's environment with only PYTHONPATH naming dpscope (and `extra`)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **extra)
    return env


def profile(
    folder: Path, *args: str, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess:
    """`python -m workloads.launch --runs-dir runs ARGS` in the user's folder."""
    return subprocess.run(
        [sys.executable, "-m", "workloads.launch", "--runs-dir", "runs", *args],
        cwd=folder,
        env=launcher_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"launcher failed\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def steps(run_dir: Path) -> list[dict]:
    with open(run_dir / "steps.csv", newline="") as f:
        return list(csv.DictReader(f))
