"""bench/cpuhog.py: a bounded, self-stopping load generator. It bursts on one clock (busy in
each period's first `duty` share, idle in the rest), stops at its deadline, and its workers stop
by themselves when the hog is killed; bad arguments are one line."""

from __future__ import annotations

import json
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


WATCH = """import sys, time, psutil
me = psutil.Process()
end = time.monotonic() + 60
while time.monotonic() < end:
    workers = [p for p in me.parent().children(recursive=True) if "--worker" in p.cmdline()]
    if workers:
        break
    time.sleep(0.05)
print(" ".join(str(p.pid) for p in workers))
sys.exit(3)
"""


def test_a_command_beside_the_hog_gets_its_load_and_gives_its_exit_status(tmp_path):
    """`python -m bench.cpuhog ... -- COMMAND` (make test-load): the command runs while a worker
    spins, the exit status is the command's, the record says so, and no worker outlives it."""
    out = tmp_path / "suite_load.json"
    proc = subprocess.run([sys.executable, "-m", "bench.cpuhog", "--cores", "1", "--deadline-s",
                           "120", "--json", str(out), "--", sys.executable, "-c", WATCH],
                          cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    first, wrote = proc.stdout.splitlines()
    pids = [int(p) for p in first.split()]
    assert wrote == f"wrote {out}"
    assert len(pids) == 1, f"the command saw {len(pids)} hog workers beside it: {proc.stdout}"
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["exit_code"] == 3 and record["wall_s"] > 0
    assert record["hog"] == {"cores": 1, "duty": 1.0, "period_s": 1.0, "deadline_s": 120.0}
    assert record["load_avg_1m_max"] >= record["load_avg_1m_start"] >= 0
    assert record["recorded"]["machine"]["cores"] == psutil.cpu_count()
    deadline = time.monotonic() + 30
    while _running_pid(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running_pid(pids[0]), "a hog worker outlived the command"


def _running_pid(pid: int) -> bool:
    try:
        return _running(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def test_a_command_that_cannot_start_or_a_missing_one_is_one_line(tmp_path):
    base = [sys.executable, "-m", "bench.cpuhog", "--cores", "1", "--deadline-s", "60"]
    for args, end in (
        (["--"], "-- must be followed by a command to run beside the hog"),
        (["--json", str(tmp_path / "x.json")], "--json needs a command after --"),
        (["--", str(tmp_path / "no-such-program")], "No such file or directory"),
    ):
        proc = subprocess.run([*base, *args], cwd=REPO, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert proc.returncode == 2 and proc.stdout == "", (args, proc.stdout)
        assert end in proc.stderr.strip().splitlines()[-1], (args, proc.stderr)
    assert not (tmp_path / "x.json").exists()
