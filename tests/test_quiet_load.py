"""Issue 33's "done when": single and DDP measured beside a bursty CPU hog (on half the time, on
every core) give, over their quiet steps, the throughput of the same runs measured without it,
while their all-steps throughput visibly falls short.

Robust on a shared 2-core machine: the reference runs (no hog) and the hogged runs come one after
the other in one test and every assertion is a ratio between them. What the claim needs is that
nothing but the hog loads the machine meanwhile, and the test measures exactly that: the CPU of
every process outside this test's own tree (the launcher's runs and the hog are in it) over each
launch (and, before each pair, over 1.5 s). When other jobs used more than 0.1 of a core per
core, it tries again (three tries in all); when they always did, there is nothing quiet to
compare with here, and the test says so and skips (in seconds on a machine busy throughout).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from analysis.runs.compare import compare_runs
from bench.cpuhog import running_hog
from profiler.runfolder.hostload import QUIET_OTHER_CORES_FRAC
from profiler.runfolder.quiet import MIN_QUIET_STEPS
from tests.conftest import launch

# About 6 s of steps on an idle 2-core machine (smallcnn: 25-30 ms a step), three hog periods.
RUN = "--mode all --model smallcnn --dataset synthetic --batch-size 64 --epochs 8 --max-steps 240"
RUN += " --no-profile --device cpu"
# On 1 s, off 1 s: a burst spans many steps, so few steps straddle its edges.
PERIOD_S, DUTY = 2.0, 0.5
CORES = psutil.cpu_count() or 1
# Cores other jobs may use beside a pair for it to count: well below the quiet-step threshold
# (0.25 per core), which lets other jobs slow a step by about that much and still call it quiet.
LIMIT = 0.4 * QUIET_OTHER_CORES_FRAC * CORES
ATTEMPTS = 3


def _busy_s() -> float:
    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))


def _mine_s(hog: psutil.Process | None) -> float:
    """CPU seconds of this process and its finished children (the launches: each waited for its
    own, so theirs are in it), plus the running hog's."""
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    if hog is not None:
        for p in [hog, *hog.children(recursive=True)]:
            own += sum(p.cpu_times()[:2])
    return own


def _others(run: Callable[[], None], hog: psutil.Process | None = None) -> float:
    """Cores' worth of CPU that processes outside this test's tree used while `run` ran."""
    busy0, mine0, t0 = _busy_s(), _mine_s(hog), time.perf_counter()
    run()
    busy1, mine1 = _busy_s(), _mine_s(hog)
    return max(0.0, (busy1 - busy0 - (mine1 - mine0)) / (time.perf_counter() - t0))


def _runs(runs_dir: Path) -> dict[str, dict]:
    data = compare_runs([runs_dir], progress=False, traces=False)
    return {r["mode"]: r for r in data["runs"] if r["status"] == "ok"}


def _pair(tmp: Path) -> tuple[dict, dict, float]:
    """The runs without the hog, then beside it, and the most CPU other jobs used in either."""
    ref_dir, hog_dir = tmp / "quiet", tmp / "hog"
    others = _others(lambda: launch([*RUN.split(), "--runs-dir", str(ref_dir)], timeout=600))
    with running_hog(CORES, duty=DUTY, period_s=PERIOD_S, deadline_s=600) as proc:
        hogged = _others(
            lambda: launch([*RUN.split(), "--runs-dir", str(hog_dir)], timeout=600),
            psutil.Process(proc.pid),
        )
    return _runs(ref_dir), _runs(hog_dir), max(others, hogged)


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_quiet_steps_beside_a_bursty_hog_give_the_quiet_runs_throughput(tmp_path):
    seen = []
    for attempt in range(ATTEMPTS):
        others = _others(lambda: time.sleep(1.5))  # a busy machine now: no pair worth running
        if others <= LIMIT:
            ref, hog, others = _pair(tmp_path / f"try{attempt}")
        seen.append(f"{others:.1f}")
        if others <= LIMIT:
            break
        time.sleep(5)
    else:
        pytest.skip(f"other jobs used {' and '.join(seen)} cores beside this test's runs (more "
                    f"than {LIMIT:.1f}): no quiet machine to compare with here")  # fmt: skip
    for mode in ("single", "ddp"):
        quiet, busy = ref[mode], hog[mode]
        assert quiet["throughput_basis"] == "quiet", f"{mode} without the hog: {quiet}"
        assert busy["busy_steps"] >= 5, f"{mode}: the hog's bursts were not seen: {busy}"
        assert busy["quiet_steps"] >= MIN_QUIET_STEPS, f"{mode}: {busy}"
        assert busy["throughput_basis"] == "quiet" and not busy["throughput_noisy"]
        reference = quiet["samples_per_s"]  # over its quiet steps: all of them, nothing else ran
        ratio = busy["samples_per_s_quiet"] / reference
        slowed = busy["samples_per_s_all"] / reference
        assert 0.9 <= ratio <= 1.1, (
            f"{mode}: quiet steps beside the hog at {ratio:.2f}× the runs without it"
        )
        assert slowed < 0.9, f"{mode}: all steps at {slowed:.2f}×: the hog did not slow the run"
        assert busy["samples_per_s"] == busy["samples_per_s_quiet"]  # the headline is the quiet one
