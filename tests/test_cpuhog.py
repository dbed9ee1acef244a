"""bench/cpuhog.py: a bounded, self-stopping load generator. It bursts on one clock (busy in
each period's first `duty` share, idle in the rest), stops at its deadline, and its workers stop
by themselves when the hog is killed; bad arguments are one line."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from bench.cpuhog import TICK_S, running_hog, start_hog
from tests.conftest import REPO

pytestmark = pytest.mark.integration


def _workers(hog: subprocess.Popen, n: int) -> list[psutil.Process]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        kids = psutil.Process(hog.pid).children()
        if len(kids) == n:
            return kids
        time.sleep(0.05)
    raise AssertionError(f"the hog started {len(kids)} of {n} workers")


def _running(p: psutil.Process) -> bool:
    """Alive and not a zombie (an orphan's exit may wait for a reaper that never comes)."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cpu(procs: list[psutil.Process]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def _until_phase(period: float, phase: float) -> None:
    time.sleep((phase - time.time() % period) % period)


def test_bursts_are_on_one_clock():
    """Period 1 s, duty 0.5: the workers use CPU in each second's first half and none (beyond
    a scheduling delay) in the middle of its second half."""
    with running_hog(2, duty=0.5, period_s=1.0, deadline_s=60) as hog:
        workers = _workers(hog, 2)
        on = off = 0.0
        for _ in range(3):
            _until_phase(1.0, 0.1)
            c0 = _cpu(workers)
            _until_phase(1.0, 0.4)
            on += _cpu(workers) - c0
            _until_phase(1.0, 0.65)
            c0 = _cpu(workers)
            _until_phase(1.0, 0.9)
            off += _cpu(workers) - c0
    assert on > 0.05, f"the workers got almost no CPU while on ({on:.2f} s): nothing to compare"
    assert off <= 0.05 + 3 * TICK_S and off < on / 4, (on, off)


def test_the_hog_stops_at_its_deadline_and_its_workers_when_it_is_killed():
    hog = start_hog(1, duty=1.0, period_s=1.0, deadline_s=1.0)
    assert hog.wait(timeout=60) == 0
    hog = start_hog(2, duty=1.0, period_s=1.0, deadline_s=600)
    workers = _workers(hog, 2)
    hog.kill()  # no chance to stop them itself
    hog.wait()
    deadline = time.monotonic() + 30
    while any(_running(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(w) for w in workers), "workers outlived their hog"


def test_bad_arguments_are_one_line():
    proc = subprocess.run([sys.executable, "-m", "bench.cpuhog", "--duty", "2"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].endswith("--duty must be in (0, 1]; got 2.0")
