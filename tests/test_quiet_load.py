"""Issue 33's "done when": single and DDP measured beside a bursty CPU hog (on half the time, on
every core) give, over their quiet steps, the throughput of the same runs measured without it,
while their all-steps throughput visibly falls short.

Robust on a shared 2-core machine: the reference runs (no hog) and the hogged runs come one after
the other in one test and every assertion is a ratio between them. What the claim needs is that
nothing but the hog loads the machine meanwhile, and the test measures exactly that: the CPU of
every process outside this test's own tree (the launcher's runs and the hog are in it) over each
launch (and, before each pair, over 1.5 s), counting the CPU the hypervisor gave to other
machines (steal) as theirs. When other jobs used more than 0.1 of a core per core, it tries again
(three tries in all). A shared host also slows the whole machine in ways no counter shows
(another VM's memory traffic, a lower clock: tens of percent between two launches here), so each
try brackets the hogged run with a run without the hog before and after it, and the hogged
run's quiet steps must come within 10% of one of them. A miss beside references that agree with
each other (within the same 10%) fails when it happens twice; a single one, or references that
disagree (the machine's own speed moved between the launches), makes the test try again. When no
try had a quiet, steady machine, there is nothing to compare with here, and the test says so and
skips (saying which). A broken quiet rule (busy steps counted as quiet: about 0.8× here)
misses every try, so it fails at the second.

Every run uses one torch thread per rank: a single-device run on two intra-op threads of a VM
moved with what the rest of the machine did between its steps (its quiet steps beside the hog
came out 15% faster than the runs without it on one VM, 13% slower in CI): most likely the
hypervisor's handling of idle vCPUs between the hog's bursts, not the hog's share of a step.
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

# serial: it measures other processes' CPU and needs a machine loaded only by its own runs.
pytestmark = pytest.mark.serial

# At least three hog periods of steps on an idle 2-core machine at one thread a rank: single
# about 90 ms a step (9 s), each DDP rank about 60 ms (6 s). More steps only lengthen the serial
# part of `make test` (240 took 21 s a run here) without another burst's worth of evidence.
RUN = "--mode all --model smallcnn --dataset synthetic --batch-size 64 --epochs 8 --max-steps 100"
RUN += " --no-profile --device cpu --threads 1"
# On 1 s, off 1 s: a burst spans many steps, so few steps straddle its edges.
PERIOD_S, DUTY = 2.0, 0.5
CORES = psutil.cpu_count() or 1
# Cores other jobs may use beside a pair for it to count: well below the quiet-step threshold
# (0.25 per core), which lets other jobs slow a step by about that much and still call it quiet.
LIMIT = 0.4 * QUIET_OTHER_CORES_FRAC * CORES
ATTEMPTS = 3


def _busy_s() -> float:
    t = psutil.cpu_times()
    fields = ("user", "nice", "system", "irq", "softirq", "steal")  # steal: other VMs' share
    return sum(getattr(t, f, 0.0) for f in fields)


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


def _launch(runs_dir: Path, hog: psutil.Process | None = None) -> float:
    """One launch of RUN; the cores other jobs used meanwhile."""
    return _others(lambda: launch([*RUN.split(), "--runs-dir", str(runs_dir)], timeout=600), hog)


def _bracket(tmp: Path) -> tuple[list[dict], dict, float]:
    """The runs without the hog, beside it, and without it again (machine speed drifts by tens
    of percent between launches on a shared host: the hogged run is compared with its
    neighbours), and the most CPU other jobs used in any of them."""
    before = _launch(tmp / "quiet")
    with running_hog(CORES, duty=DUTY, period_s=PERIOD_S, deadline_s=600) as proc:
        hogged = _launch(tmp / "hog", psutil.Process(proc.pid))
    after = _launch(tmp / "quiet2")
    refs = [_runs(tmp / "quiet"), _runs(tmp / "quiet2")]
    return refs, _runs(tmp / "hog"), max(before, hogged, after)


TOL = 0.1  # the quiet steps' throughput within 10% of a run without the hog
MODES = ("single", "ddp")


def _near(refs: list[dict], hog: dict, mode: str) -> dict | None:
    """The reference run the hogged run's quiet-step throughput is within TOL of, if any."""
    for ref in refs:
        if abs(hog[mode]["samples_per_s_quiet"] / ref[mode]["samples_per_s"] - 1) <= TOL:
            return ref
    return None


def _speeds(refs: list[dict], hog: dict, mode: str) -> str:
    per = "/".join(f"{r[mode]['samples_per_s']:.0f}" for r in refs)
    return f"{mode}: quiet steps {hog[mode]['samples_per_s_quiet']:.0f} samples/s, without the hog {per}"


@pytest.mark.integration
@pytest.mark.timeout(1500)
def test_quiet_steps_beside_a_bursty_hog_give_the_quiet_runs_throughput(tmp_path):
    seen, misses = [], 0
    for attempt in range(ATTEMPTS):
        tmp = tmp_path / f"try{attempt}"
        others = _others(lambda: time.sleep(1.5))  # a busy machine now: no bracket worth running
        if others <= LIMIT:
            refs, hog, others = _bracket(tmp)
        if others > LIMIT:
            seen.append(f"other jobs used {others:.1f} cores (more than {LIMIT:.1f})")
            time.sleep(5)
            continue
        missed = [m for m in MODES if _near(refs, hog, m) is None]
        if not missed:
            break
        steady = [m for m in missed if _near(refs[:1], refs[1], m) is not None]
        speeds = "; ".join(_speeds(refs, hog, m) for m in missed)
        seen.append(f"missed beside {'steady' if steady else 'moving'} references: {speeds}")
        # A miss beside references that agree counts once it repeats: one launch's speed on a
        # shared host moves by tens of percent either way (CI: 750 against 861/875 samples/s).
        misses += bool(steady)
        assert misses < 2, " | ".join(seen)  # a real miss
    else:
        why = "a miss not repeated" if misses else "no quiet, steady machine to compare with here"
        pytest.skip(f"{why}: {' | '.join(seen)}")
    for mode in MODES:
        quiet, busy = _near(refs, hog, mode)[mode], hog[mode]
        assert quiet["throughput_basis"] == "quiet", f"{mode} without the hog: {quiet}"
        assert busy["busy_steps"] >= 5, f"{mode}: the hog's bursts were not seen: {busy}"
        assert busy["quiet_steps"] >= MIN_QUIET_STEPS, f"{mode}: {busy}"
        assert busy["throughput_basis"] == "quiet" and not busy["throughput_noisy"]
        slowed = busy["samples_per_s_all"] / quiet["samples_per_s"]
        assert slowed < 0.9, f"{mode}: all steps at {slowed:.2f}×: the hog did not slow the run"
        assert busy["samples_per_s"] == busy["samples_per_s_quiet"]  # the headline is the quiet one
