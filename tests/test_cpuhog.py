"""bench/cpuhog.py, the load generator of `make test-load`: its hogs really burn CPU, the command's
exit code passes through, and no hog outlives its bound: the command's end, its deadline, or a
killed parent. Every wait is polled with a generous bound."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO

# The command run beside the hogs: it finds them (its parent's other children), waits until each
# has used CPU, prints their pids and exits with 3.
WATCH = """
import json, os, sys, time
import psutil
runner = psutil.Process(os.getppid())
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    hogs = [p for p in runner.children() if "--hog" in p.cmdline()]
    if len(hogs) == 2 and all(sum(p.cpu_times()[:2]) > 0.05 for p in hogs):
        break
    time.sleep(0.05)
print(json.dumps([p.pid for p in hogs]))
sys.exit(3)
"""


def _hog(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.cpuhog", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _gone(pids: list[int], timeout: float = 30) -> bool:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return not alive


@pytest.mark.integration
def test_hogs_burn_cpu_beside_the_command_and_stop_with_it() -> None:
    runner = _hog("--procs", "2", "--seconds", "300", "--", sys.executable, "-c", WATCH)
    out, err = runner.communicate(timeout=300)
    assert runner.returncode == 3, err  # the command's own exit code
    hogs = json.loads(out)
    assert len(hogs) == 2, (out, err)
    assert _gone(hogs)
    assert "cpuhog: 2 busy processes" in err


@pytest.mark.integration
def test_a_killed_parent_leaves_no_hog() -> None:
    runner = _hog("--procs", "2", "--seconds", "300", "--", sys.executable, "-c", "input()")
    children: list[psutil.Process] = []
    try:
        parent, deadline = psutil.Process(runner.pid), time.monotonic() + 120
        while time.monotonic() < deadline:
            children = parent.children()
            hogs = [p for p in children if "--hog" in p.cmdline()]
            if len(hogs) == 2:
                break
            time.sleep(0.05)
        assert len(hogs) == 2
        runner.kill()
        runner.wait(timeout=30)
        assert _gone([p.pid for p in hogs])
    finally:
        for child in children:  # the command itself (its stdin closes with the runner)
            if child.is_running():
                child.kill()


@pytest.mark.integration
def test_hogs_stop_at_their_deadline_without_a_command() -> None:
    start = time.monotonic()
    runner = _hog("--procs", "1", "--seconds", "1")
    runner.communicate(timeout=120)
    assert runner.returncode == 0 and time.monotonic() - start >= 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--duty", "2"], "--duty must be in (0, 1]"),
        (["--procs", "0"], "--procs must be >= 1"),
        (["--seconds", "0"], "--seconds must be > 0"),
    ],
)
def test_bad_options_are_one_line(args: list[str], match: str, capsys) -> None:
    from bench.cpuhog import main

    with pytest.raises(SystemExit) as exit_:
        main([*args, "--", "true"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err
