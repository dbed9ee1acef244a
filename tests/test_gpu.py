"""The GPU checks (workloads/tools/gpu_check.py) as pytest tests: `make gpu-check` runs them.

One real pass of every mode on the GPUs present (the module docstring lists the runs and the
checks); each run label is then one test, which fails with the checks that failed for it. Without
CUDA every test is skipped with that reason: nothing here can pass on a CPU-only machine.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="torch sees no CUDA device: the GPU checks run where one is (make gpu-check)",
    ),
]

LINE = re.compile(r"^(PASS|FAIL)  (\S+)\s+(.*)$")
# The runs every GPU machine makes; dp-bf16 (bf16 GPUs), projection and the hang (2+ GPUs) when
# they apply.
LABELS = (
    "single",
    "dp",
    "dp-bf16",
    "ddp-nccl",
    "ddp-gloo",
    "ddp-nccl-fp16",
    "ddp-nccl-view",
    "ddp-nccl-syncbn",
    "single-b32",
    "projection",
    "ddp-nccl-hang",
)


@pytest.fixture(scope="module")
def gpu_check(request, tmp_path_factory) -> dict[str, list[tuple[bool, str]]]:
    """{label: [(passed, check line)]} from one run of `python -m workloads.tools.gpu_check`;
    the run folders go to --gpu-runs-dir (make gpu-check: RUNS/gpu-check) or a temp folder."""
    kept = request.config.getoption("--gpu-runs-dir")
    runs = Path(kept).resolve() if kept else tmp_path_factory.mktemp("gpu-check")
    cmd = [sys.executable, "-m", "workloads.tools.gpu_check", "--runs-dir", str(runs)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    results: dict[str, list[tuple[bool, str]]] = {}
    for line in proc.stdout.splitlines():
        if m := LINE.match(line):
            results.setdefault(m[2], []).append((m[1] == "PASS", m[3]))
    assert results, f"no check ran (exit {proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    summary = re.search(r"gpu-check: (\d+) passed, (\d+) failed", proc.stdout)
    assert summary, proc.stdout[-4000:] + proc.stderr[-4000:]
    failed = sum(not ok for checks in results.values() for ok, _ in checks)
    assert int(summary[2]) == failed and (proc.returncode == 0) == (failed == 0)
    return results


def _expected(label: str) -> bool:
    gpus = torch.cuda.device_count()
    if label == "dp-bf16":
        return torch.cuda.is_bf16_supported()
    if label in ("single-b32", "projection", "ddp-nccl-hang"):
        return gpus > 1
    return True


@pytest.mark.parametrize("label", LABELS)
def test_gpu_run(gpu_check, label: str) -> None:
    if not _expected(label):
        pytest.skip(f"{label}: not run on this machine ({torch.cuda.device_count()} GPU(s))")
    checks = gpu_check.get(label)
    assert checks, f"{label}: no checks ran; labels seen: {sorted(gpu_check)}"
    failed = [line for ok, line in checks if not ok]
    assert not failed, f"{label}: " + "; ".join(failed)


def test_every_label_is_known(gpu_check) -> None:
    """A label gpu_check adds later must get its own test here, not pass unseen."""
    assert set(gpu_check) <= set(LABELS), sorted(set(gpu_check) - set(LABELS))


def test_gpu_check_runs_on_its_own() -> None:
    """`python -m workloads.tools.gpu_check` stays a script too (its --help is one call)."""
    proc = subprocess.run(
        [sys.executable, "-m", "workloads.tools.gpu_check", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "--runs-dir" in proc.stdout
