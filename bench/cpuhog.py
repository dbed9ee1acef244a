"""A bounded, self-stopping CPU hog: `make test-load` runs the suite beside one on every core.

`python -m bench.cpuhog [--procs N] [--seconds S] [--duty D] [--period-s P] -- COMMAND ...`
starts N busy processes (default: one per logical core), runs COMMAND, stops the hogs when it
ends and exits with its exit code. Without COMMAND it hogs until `--seconds` pass or Ctrl-C.

Each hog spins in pure Python, busy for `duty` x `period_s` seconds of every `period_s` (duty 1:
always busy; 0.5: a bursty neighbour, on half the time) and stops by itself:
- when `--seconds` have passed (default 3600 s), whatever happens to the parent;
- when its parent is gone (checked every 0.1 s: a killed `make` or terminal leaves no hog);
- on SIGTERM/SIGINT, or when the parent stops it at COMMAND's end.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from profiler.runfolder.errors import OneLineParser
from workloads.launch.child import child_env

__all__ = ["main", "spin", "start_hogs", "stop_hogs"]

CHECK_S = 0.1  # how often a hog looks at its deadline and its parent


def spin(deadline: float, parent: int, duty: float, period_s: float) -> None:
    """Busy-loop until `deadline` (time.monotonic()) or until process `parent` is no longer this
    process's parent; busy `duty` of every `period_s` seconds and asleep the rest."""
    while time.monotonic() < deadline and os.getppid() == parent:
        start = time.monotonic()
        busy_until = start + duty * period_s
        next_check = start + CHECK_S
        while (now := time.monotonic()) < busy_until:
            if now >= next_check:
                if os.getppid() != parent:
                    return
                next_check = now + CHECK_S
        rest = start + period_s - time.monotonic()
        while rest > 0 and os.getppid() == parent:
            time.sleep(min(rest, CHECK_S))
            rest = start + period_s - time.monotonic()


def start_hogs(
    procs: int, seconds: float, duty: float = 1.0, period_s: float = 1.0
) -> list[subprocess.Popen]:
    """Start `procs` hog processes that stop by themselves after `seconds` (or with this one)."""
    argv = [sys.executable, "-m", "bench.cpuhog", "--hog", str(os.getpid())]
    argv += ["--seconds", str(seconds), "--duty", str(duty), "--period-s", str(period_s)]
    env = child_env()  # bench/ importable from any folder
    return [subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL) for _ in range(procs)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    """Stop every hog (SIGTERM, then SIGKILL after 5 s) and reap it."""
    for hog in hogs:
        if hog.poll() is None:
            hog.terminate()
    for hog in hogs:
        try:
            hog.wait(timeout=5)
        except subprocess.TimeoutExpired:
            hog.kill()
            hog.wait()


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m bench.cpuhog",
        description="Run COMMAND beside a busy process on every core (bounded, self-stopping).",
    )
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1, help="default: cores")
    parser.add_argument(
        "--seconds", type=float, default=3600.0, help="each hog stops after this (default 3600)"
    )
    parser.add_argument(
        "--duty", type=float, default=1.0, help="busy share of each period, 0-1 (default 1)"
    )
    parser.add_argument("--period-s", type=float, default=1.0, help="duty period (default 1 s)")
    parser.add_argument("--hog", type=int, default=None, help=argparse.SUPPRESS)  # parent pid
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS ...")
    return parser


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.procs < 1:
        parser.error(f"--procs must be >= 1, got {args.procs}")
    if not 0 < args.seconds:
        parser.error(f"--seconds must be > 0, got {args.seconds}")
    if not 0 < args.duty <= 1:
        parser.error(f"--duty must be in (0, 1], got {args.duty}")
    if not args.period_s > 0:
        parser.error(f"--period-s must be > 0, got {args.period_s}")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _check(parser, args)
    if args.hog is not None:  # one hog: stop quietly on SIGTERM/SIGINT
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
        spin(time.monotonic() + args.seconds, args.hog, args.duty, args.period_s)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    hogs = start_hogs(args.procs, args.seconds, args.duty, args.period_s)
    print(
        f"cpuhog: {args.procs} busy processes ({args.duty:.0%} duty, at most {args.seconds:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    try:
        if not command:
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                time.sleep(CHECK_S)
            return 0
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130
    finally:
        stop_hogs(hogs)


if __name__ == "__main__":
    sys.exit(main())
