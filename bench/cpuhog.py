"""A bounded, self-stopping CPU load generator: other processes for a measurement to run beside.

    python -m bench.cpuhog --cores 2 --duty 0.5 --period-s 1 --deadline-s 60
    python -m bench.cpuhog --deadline-s 5400 -- python -m pytest     # make test-load

keeps `--cores` cores busy in bursts: every worker spins for `duty` × `period_s` at the start of
each period and sleeps for the rest, all on one clock, so the bursts load every core at once
(duty 1: always on). It can't outlive what started it: each worker (one process per core, so the
load is real CPU, not one GIL) exits at the deadline (seconds from its start) or within one tick
(TICK_S) of its parent being gone, and the hog process exits when its workers have.

With a command after `--`, the hog runs while that command does and stops when it ends; the exit
status is the command's (`run_beside`). From Python, `start_hog(...)` starts it as a subprocess and `running_hog(...)` is the same as a
context manager that stops it on exit; `hog(...)` runs it in the calling process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from bench.common import write_json
from workloads.launch.child import child_env, stop_process

__all__ = ["TICK_S", "hog", "main", "run_beside", "running_hog", "start_hog"]

TICK_S = 0.05
"""How often a spinning worker looks at the clock and at its parent."""
LOAD_EVERY_S = 5.0
"""How often `run_beside` reads the load average while its command runs."""


def _check(cores: int, duty: float, period_s: float, deadline_s: float) -> None:
    if cores < 1:
        raise ValueError(f"--cores must be >= 1; got {cores}")
    if not 0 < duty <= 1:
        raise ValueError(f"--duty must be in (0, 1]; got {duty}")
    if not period_s > 0 or not deadline_s > 0:
        raise ValueError(f"--period-s and --deadline-s must be > 0; got {period_s}, {deadline_s}")


def _alive(parent: psutil.Process) -> bool:
    try:
        return parent.is_running() and parent.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _parent(pid: int | None) -> psutil.Process | None:
    """The process whose end stops this one: `pid` as its starter passed it (asked of the OS
    after starting, a parent that died at once would already be replaced by a reaper)."""
    try:
        return psutil.Process(os.getppid() if pid is None else pid)
    except psutil.Error:
        return None


def _worker(duty: float, period_s: float, deadline_s: float, parent_pid: int | None) -> None:
    """One core's bursts until the deadline or the parent's end."""
    parent = _parent(parent_pid)
    if parent is None:
        return
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and _alive(parent):
        phase = time.time() % period_s  # the wall clock: every worker bursts at once
        if phase < duty * period_s:
            stop = min(time.monotonic() + min(duty * period_s - phase, TICK_S), end)
            while time.monotonic() < stop:
                pass
        else:
            time.sleep(min(period_s - phase, TICK_S))


def _command(cores: int, duty: float, period_s: float, deadline_s: float) -> list[str]:
    return [sys.executable, "-m", "bench.cpuhog", "--cores", str(cores), "--duty", str(duty),
            "--period-s", str(period_s), "--deadline-s", str(deadline_s),
            "--parent-pid", str(os.getpid())]  # fmt: skip


def hog(
    cores: int,
    duty: float = 1.0,
    period_s: float = 1.0,
    deadline_s: float = 60.0,
    *,
    parent_pid: int | None = None,
) -> None:
    """Run the load here: one worker process per core; return when every worker has ended (the
    deadline, or the process `parent_pid` (default: this one's parent) gone)."""
    _check(cores, duty, period_s, deadline_s)
    parent = _parent(parent_pid)
    worker = [*_command(1, duty, period_s, deadline_s), "--worker"]
    # Each worker in a session of its own, as another user's job is: with the kernel's
    # autogroup scheduling, CPU is shared between sessions first.
    procs = [
        subprocess.Popen(worker, env=child_env(), start_new_session=os.name == "posix")
        for _ in range(cores)
    ]
    try:
        while any(p.poll() is None for p in procs):
            if parent is None or not _alive(parent):
                break  # the workers see this process go and stop themselves
            time.sleep(TICK_S)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()


def start_hog(
    cores: int, duty: float = 1.0, period_s: float = 1.0, deadline_s: float = 60.0
) -> subprocess.Popen:
    """`hog(...)` as a subprocess of this one (stop it with `.terminate()`; it ends by itself at
    the deadline or when this process ends)."""
    _check(cores, duty, period_s, deadline_s)
    return subprocess.Popen(_command(cores, duty, period_s, deadline_s), env=child_env())


@contextlib.contextmanager
def running_hog(
    cores: int, duty: float = 1.0, period_s: float = 1.0, deadline_s: float = 60.0
) -> Iterator[subprocess.Popen]:
    """`start_hog(...)` for the `with` block: the hog and its workers are gone after it."""
    proc = start_hog(cores, duty, period_s, deadline_s)
    try:
        yield proc
    finally:
        stop_process(proc)


def run_beside(
    command: list[str], cores: int, duty: float = 1.0, period_s: float = 1.0,
    deadline_s: float = 60.0, *, json_path: Path | None = None,
) -> int:  # fmt: skip
    """Run `command` beside `running_hog(...)`; its exit status (the hog stops when it ends, or
    at the deadline if that comes first: the command then goes on without the load).

    `json_path`: also write what was measured there (bench.common.write_json): `exit_code`,
    `wall_s` (seconds the command ran), `load_avg_1m_start` / `load_avg_1m_max` (the 1-minute
    load average as the hog started / the highest of its readings every LOAD_EVERY_S while the
    command ran), the `command` and the `hog`'s settings."""
    loads = [os.getloadavg()[0]]
    t0 = time.perf_counter()
    with running_hog(cores, duty, period_s, deadline_s):
        try:
            proc = subprocess.Popen(command)
        except OSError as exc:
            print(f"bench.cpuhog: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
            return 2
        while True:
            try:
                rc = proc.wait(timeout=LOAD_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                loads.append(os.getloadavg()[0])
    if json_path is not None:
        hog = {"cores": cores, "duty": duty, "period_s": period_s, "deadline_s": deadline_s}
        write_json(json_path, {"command": " ".join(command), "exit_code": rc,
                               "wall_s": round(time.perf_counter() - t0, 1),
                               "load_avg_1m_start": loads[0], "load_avg_1m_max": max(loads),
                               "hog": hog})  # fmt: skip
        print(f"wrote {json_path}")
    return rc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[argv.index("--") + 1 :] if "--" in argv else None
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="python -m bench.cpuhog",
        description=__doc__.split("\n")[0],
        usage="%(prog)s [options] [-- COMMAND ...]",
    )
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores to load")
    parser.add_argument("--duty", type=float, default=1.0, help="share of each period spent busy")
    parser.add_argument("--period-s", type=float, default=1.0, help="seconds per on/off cycle")
    parser.add_argument("--deadline-s", type=float, default=60.0, help="stop after this long")
    parser.add_argument(
        "--parent-pid", type=int, default=None, help="stop when this process ends (default: parent)"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="with a command: write what was measured here"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        _check(args.cores, args.duty, args.period_s, args.deadline_s)
    except ValueError as exc:
        parser.error(str(exc))
    if command is not None and (args.worker or not command):
        parser.error("-- must be followed by a command to run beside the hog")
    if args.json is not None and not command:
        parser.error("--json needs a command after --: it records that command's run")
    if command:
        return run_beside(command, args.cores, args.duty, args.period_s, args.deadline_s,
                          json_path=args.json)  # fmt: skip
    if args.worker:
        _worker(args.duty, args.period_s, args.deadline_s, args.parent_pid)
    else:
        hog(args.cores, args.duty, args.period_s, args.deadline_s, parent_pid=args.parent_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
