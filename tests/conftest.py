"""Shared fixtures: real run folders made once per session by the real launcher (torchrun).

Tests across issues (instrumentation, analysis, report) reuse these two runs so the suite stays
well under 10 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from profiler.records import read_comm_record, read_record, record_kind
from profiler.runfolder import RUN_JSON

REPO = Path(__file__).resolve().parents[1]
# Reference traces from other public projects (origin, licence, their tools outputs: README.md).
DATA = REPO / "tests" / "data"


def run_in_repo(
    cmd: list[str], *, timeout: float = 120, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `cmd` from the repo root with text output captured; return the finished process."""
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def launch(
    args: list[str], *, timeout: float = 240, check: bool = True
) -> subprocess.CompletedProcess:
    """Run `python -m workloads.launch ARGS` from the repo root; return the finished process."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = run_in_repo([sys.executable, "-m", "workloads.launch", *args], timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"launcher failed ({proc.returncode})\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"
        )
    return proc


def free_port() -> int:
    """A loopback TCP port free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_run(run_dir: Path) -> dict:
    """run.json as written, once the typed reader (profiler.records) has accepted it: every test
    that reads a real run folder also checks that its writer keeps the run-folder contract."""
    path = run_dir / RUN_JSON
    reader = read_comm_record if record_kind(path) == "comm" else read_record
    _, raw = reader(path)
    assert raw == json.loads(path.read_text()), "the typed reader must not change the record"
    return raw


# The tiny profiled workload both session runs use (a list of launcher arguments). On CPU even
# where a GPU exists, so the suite checks the same thing on every machine.
TINY = "--model mlp --dataset synthetic --max-steps 8 --batch-size 64 --epochs 1 --seed 0 --device cpu".split()


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def single_mlp_run(runs_dir: Path) -> Path:
    """A profiled single-device MLP run (8 steps, global batch 64)."""
    launch(["--mode", "single", "--run-id", "single-mlp", "--runs-dir", str(runs_dir), *TINY])
    return runs_dir / "single-mlp"


@pytest.fixture(scope="session")
def ddp_mlp_run(runs_dir: Path) -> Path:
    """A profiled 2-rank gloo DDP MLP run through torchrun (8 steps, global batch 64)."""
    ddp = "--mode ddp --nproc 2 --backend gloo --run-id ddp-gloo-mlp".split()
    launch([*ddp, "--runs-dir", str(runs_dir), *TINY])
    return runs_dir / "ddp-gloo-mlp"
