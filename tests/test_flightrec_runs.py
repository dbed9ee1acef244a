"""Hangs and desyncs named from torch's flight recorder, with real 2-rank gloo jobs of unedited
user scripts (tests/scripts/, copied outside the repository) under `--script --mode ddp`:

- loss_hang.py: rank 1 stalls before its 5th all_reduce; --collective-timeout 3 is the
  process group's default timeout, so rank 0 times out after 3 s;
- the same with the script's own 600 s timeout (kept): the launcher's watchdog ends it from the
  script's heartbeat (step hooks, recorder progress, the main thread's line);
- size_mismatch.py: rank 1's 5th all_reduce has half the elements (gloo aborts it).

dpscope's own loop with DPSCOPE_HANG_RANK is tests/test_faults.py's hang test. The three runs
start together (they mostly wait); each wait is bounded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis.cli.main import main as analysis_main
from tests.conftest import REPO, read_run

# serial: its bounds time the collective timeout and the watchdog.
pytestmark = [pytest.mark.integration, pytest.mark.serial]

RUNS = {
    "fr-hang": ["loss_hang.py"],
    "fr-own-timeout": ["loss_hang.py", "--", "--own-timeout", "600"],
    "fr-sizes": ["size_mismatch.py"],
}


@pytest.fixture(scope="module")
def fr_runs(tmp_path_factory) -> tuple[Path, dict[str, tuple[int, float]]]:
    """The user's runs folder and {run_id: (launcher exit code, seconds)} of RUNS."""
    user = tmp_path_factory.mktemp("user project")
    for name in ("loss_hang.py", "size_mismatch.py"):
        shutil.copy(REPO / "tests" / "scripts" / name, user / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    procs = {}
    for run_id, (script, *rest) in RUNS.items():
        cmd = [
            sys.executable,
            "-m",
            "workloads.launch",
            "--runs-dir",
            "runs",
            "--script",
            script,
            "--mode",
            "ddp",
            "--nproc",
            "2",
            "--collective-timeout",
            "3",
            "--no-profile",
            "--run-id",
            run_id,
            *rest,
        ]
        procs[run_id] = (
            subprocess.Popen(
                cmd, cwd=user, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            ),
            time.monotonic(),
        )
    out = {}
    try:
        for run_id, (proc, start) in procs.items():
            out[run_id] = (
                proc.wait(timeout=max(1, start + 240 - time.monotonic())),
                time.monotonic() - start,
            )
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
    return user / "runs", out


def test_a_script_rank_that_hangs_is_named_with_the_collective_it_never_entered(fr_runs):
    runs, codes = fr_runs
    assert codes["fr-hang"][0] == 1
    err = read_run(runs / "fr-hang")["error"]
    fr = err["flight_recorder"]
    assert err["kind"] == "hang" and err["rank"] == 1
    assert (fr["collective"], fr["seq"], fr["entered"], fr["never_entered"]) == (
        "all_reduce",
        5,
        [0],
        [1],
    )
    # --collective-timeout 3 became the script's process-group timeout: rank 0 waited ~3 s.
    assert 2.5 <= fr["waited_s"]["0"] < 60
    assert "Timed out waiting 3000ms" in err["message"]
    assert err["message"].startswith("rank 1 never entered all_reduce #5 (rank 0 waited ")
    assert "; its last phase: data, step 5 — rank 0 failed" in err["message"]  # the step hooks'
    assert sorted(fr["dumps"]) == ["rank0.flightrec.json", "rank1.flightrec.json"]


def test_the_scripts_own_timeout_is_kept_and_the_watchdog_ends_the_hang(fr_runs):
    runs, codes = fr_runs
    code, seconds = codes["fr-own-timeout"]
    assert code == 1 and seconds < 200
    err = read_run(runs / "fr-own-timeout")["error"]
    fr = err["flight_recorder"]
    assert err["kind"] == "hang" and "stopped progressing at step 5" in err["message"]  # watchdog
    assert err["rank"] == 1 and (fr["seq"], fr["never_entered"]) == (5, [1])
    # No 3 s timeout fired: rank 0 was still inside all_reduce #5 when the watchdog (3 s + 10 s
    # of no progress) asked for the dumps.
    assert fr["waited_s"]["0"] >= 10
    assert "Timed out" not in err["message"]


def test_ranks_that_all_reduce_different_sizes_are_a_desync(fr_runs):
    runs, codes = fr_runs
    assert codes["fr-sizes"][0] == 128 + 6  # dpscope exits as the first failing rank: SIGABRT
    err = read_run(runs / "fr-sizes")["error"]
    fr = err["flight_recorder"]
    assert err["kind"] == "desync" and err["rank"] == 1 and err["exit_code"] == -6
    assert (fr["collective"], fr["seq"], fr["entered"]) == ("all_reduce", 5, [0])
    assert err["message"].startswith("desync at all_reduce #5: gloo aborted rank 1 (")
    assert "Received data size doesn't match expected size" in err["message"]
    assert "rank 0 last entered all_reduce #5 with input sizes [[1000]] (Float)" in err["message"]
    assert fr["no_dump"] == [1]  # gloo kills that rank at once: no dump of its own
    # What each used: rank 0's from its dump; rank 1's only record is gloo's line, a message
    # larger than the buffer its (half as long) tensor gave it.
    [mine, aborted] = fr["desync"]
    assert (mine["rank"], mine["op"], mine["input_sizes"]) == (0, "all_reduce", [[1000]])
    assert (aborted["rank"], aborted["op"]) == (1, None)
    assert aborted["received_bytes"] > aborted["expected_bytes"] > 0


def test_dpscope_flightrec_reads_the_dumps_and_bad_input_is_one_line(fr_runs, capsys):
    runs, _ = fr_runs
    assert analysis_main(["flightrec", str(runs / "fr-hang")], prog="dpscope") == 0
    out = capsys.readouterr().out
    assert "rank 0: rank0.flightrec.json, 5 collectives; last all_reduce #5" in out
    assert "rank 1: rank1.flightrec.json, 4 collectives; last all_reduce #4" in out
    assert "rank 1 never entered all_reduce #5" in out
    logs = runs / "fr-hang" / "logs"
    (logs / "rank1.flightrec.json").write_bytes(b'{"kind": "dpscope flight')  # cut short
    assert analysis_main(["flightrec", str(runs / "fr-hang")], prog="dpscope") == 0
    out = capsys.readouterr().out
    assert "warning: logs/rank1.flightrec.json: not valid JSON" in out
    assert "warning: no dump from rank 1" in out
    empty = runs / "empty"
    (empty / "logs").mkdir(parents=True)
    assert analysis_main(["flightrec", str(empty)], prog="dpscope") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no usable flight-recorder dump" in err[0]
