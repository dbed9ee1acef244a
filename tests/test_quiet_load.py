"""Issue 33's "done when": single and DDP measured beside a bursty CPU hog (on half the time, on
every core) give, over their quiet steps, the throughput of the same runs measured without it,
while their all-steps throughput visibly falls short.

Robust on a shared 2-core machine: the reference runs (no hog) and the hogged runs come one after
the other in one test and every assertion is a ratio between them. Quiet steps need a machine
other jobs leave mostly alone now and then: when even the reference runs have fewer than 8 quiet
steps (other processes used more than 0.25 of a core per core the run uses throughout), the
claim cannot be measured here and the test says so and skips after a second try.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from analysis.runs.compare import compare_runs
from bench.cpuhog import running_hog
from profiler.runfolder.quiet import MIN_QUIET_STEPS
from tests.conftest import launch

RUN = "--mode all --model smallcnn --dataset synthetic --batch-size 64 --epochs 2 --max-steps 40"
RUN += " --no-profile --device cpu"
# On 1 s, off 1 s: a burst spans many steps, so few steps straddle its edges.
PERIOD_S, DUTY = 2.0, 0.5
ATTEMPTS = 2


def _runs(runs_dir: Path) -> dict[str, dict]:
    data = compare_runs([runs_dir], progress=False, traces=False)
    return {r["mode"]: r for r in data["runs"] if r["status"] == "ok"}


def _measure(tmp: Path) -> tuple[dict, dict]:
    """The reference runs, then the same runs beside the hog: {mode: run entry} each."""
    launch([*RUN.split(), "--runs-dir", str(tmp / "quiet")], timeout=600)
    cores = psutil.cpu_count() or 1
    with running_hog(cores, duty=DUTY, period_s=PERIOD_S, deadline_s=600):
        launch([*RUN.split(), "--runs-dir", str(tmp / "hog")], timeout=600)
    return _runs(tmp / "quiet"), _runs(tmp / "hog")


def _quiet_enough(runs: dict) -> bool:
    return all(r["throughput_basis"] == "quiet" for r in runs.values()) and len(runs) == 2


@pytest.mark.integration
def test_quiet_steps_beside_a_bursty_hog_give_the_quiet_runs_throughput(tmp_path):
    for attempt in range(ATTEMPTS):
        ref, hog = _measure(tmp_path / f"try{attempt}")
        if _quiet_enough(ref):
            break
    else:
        loads = {m: r["host_load"]["other_cpu_cores_mean"] for m, r in ref.items()}
        pytest.skip(
            f"the machine is busy without the hog (other processes' cores during the reference "
            f"runs: {loads}): fewer than {MIN_QUIET_STEPS} quiet steps to compare with"
        )
    for mode in ("single", "ddp"):
        quiet, busy = ref[mode], hog[mode]
        assert busy["busy_steps"] >= 5, f"{mode}: the hog's bursts were not seen: {busy}"
        assert busy["quiet_steps"] >= MIN_QUIET_STEPS, f"{mode}: {busy}"
        assert busy["throughput_basis"] == "quiet" and not busy["throughput_noisy"]
        reference = quiet["samples_per_s"]  # its own quiet steps: every step, on an idle machine
        ratio = busy["samples_per_s_quiet"] / reference
        slowed = busy["samples_per_s_all"] / reference
        assert 0.9 <= ratio <= 1.1, (
            f"{mode}: quiet steps beside the hog at {ratio:.2f}× the run without it"
        )
        assert slowed < 0.9, f"{mode}: all steps at {slowed:.2f}×: the hog did not slow the run"
        assert busy["samples_per_s"] == busy["samples_per_s_quiet"]  # the headline is the quiet one
