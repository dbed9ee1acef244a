"""Run the training command under supervision: relay its output, watch the ranks' heartbeats,
and never leave a process behind.

- Output goes raw (progress bars work) to the console and to `logs/launcher.log`.
- A watchdog thread reads `logs/rank<r>.heartbeat.json` every second. Once the first beat has
  appeared, if no rank's beat changes for `stall_s` seconds the job is declared hung: the
  ranks' last beats are turned into the hang diagnosis, every rank is asked to dump its flight
  recorder (workloads.launch.flightrec, waited for a few seconds) and the process tree is ended.
- Ctrl-C (SIGINT) or SIGTERM to the launcher ends the process tree too, and the outcome says
  `interrupted`. torchrun starts each rank in a session of its own, so a signal to torchrun's
  process group does not reach them: the tree is snapshotted first, torchrun is asked to stop
  its workers (SIGTERM), and whatever is still alive after the grace period is SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from workloads.launch.flightrec import PEER_WAIT_S, request_dumps, wait_for_dumps
from workloads.launch.heartbeat import diagnose_hang, read_heartbeats

__all__ = ["WATCHDOG_GRACE_S", "Outcome", "run_supervised"]

GRACE_S = 30.0
"""How long torchrun gets to stop its workers before everything left is SIGKILLed."""
WATCHDOG_GRACE_S = 10.0
"""The watchdog waits this much longer than --collective-timeout, so that a rank's own timeout
error (and its flight-recorder dump) comes first when a rank hangs in a collective."""


@dataclass(frozen=True)
class Outcome:
    """How the supervised command ended."""

    returncode: int
    hang: dict | None = None
    """diagnose_hang's fields when the watchdog ended the job."""
    interrupted: str | None = None
    """SIGINT or SIGTERM when the launcher was interrupted."""


class _Terminated(Exception):
    """SIGTERM reached the launcher."""


def _on_sigterm(signum, frame) -> None:
    raise _Terminated


def _stop_tree(proc: subprocess.Popen, *, grace_s: float = GRACE_S) -> None:
    """SIGTERM `proc` (torchrun stops its workers on it), then SIGKILL whatever of its process
    tree, as it was before the signal, is still alive after `grace_s`."""
    try:
        # Descendants only: psutil must not reap `proc` itself, or Popen would read exit code 0.
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
    _, alive = psutil.wait_procs(children, timeout=max(0.0, deadline - time.monotonic()))
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    proc.wait()


def _signature(beats: dict[int, dict]) -> tuple:
    return tuple(
        sorted(
            (r, b.get("attempt"), b.get("step"), b.get("phase"), b.get("time"))
            for r, b in beats.items()
        )
    )


def _watch(
    proc: subprocess.Popen, logs: Path, stall_s: float, done: threading.Event, found: dict
) -> None:
    last_sig, last_change = None, time.monotonic()
    while not done.wait(1.0) and proc.poll() is None:
        beats = read_heartbeats(logs)
        if not beats:
            last_change = time.monotonic()  # start-up: rendezvous has its own timeout
            continue
        sig = _signature(beats)
        if sig != last_sig:
            last_sig, last_change = sig, time.monotonic()
        elif time.monotonic() - last_change > stall_s:
            found.update(diagnose_hang(beats))
            print(
                f"\nworkloads.launch: no heartbeat progress for {stall_s:.0f} s — {found['message']}; "
                "stopping the job",
                file=sys.stderr,
                flush=True,
            )
            if len(beats) > 1:  # every live rank dumps its flight recorder first
                since = request_dumps(logs, f"watchdog: no progress for {stall_s:.0f} s")
                wait_for_dumps(logs, sorted(beats), since, PEER_WAIT_S)
            _stop_tree(proc)
            return


def run_supervised(
    cmd: list[str], *, env: dict, log_path: Path, logs: Path, stall_s: float
) -> Outcome:
    """Run `cmd` in this process's working folder, relaying its output to the console and
    `log_path`; see the module docstring."""
    found: dict = {}
    done = threading.Event()
    interrupted = None
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        watcher = threading.Thread(
            target=_watch, args=(proc, logs, stall_s, done, found), daemon=True
        )
        watcher.start()
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
        try:
            while chunk := os.read(proc.stdout.fileno(), 65536):
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                log.write(chunk)
            proc.wait()
        except (KeyboardInterrupt, _Terminated) as exc:
            interrupted = "SIGINT" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
            print(
                f"\nworkloads.launch: {interrupted}: stopping the job", file=sys.stderr, flush=True
            )
            # Ignore further signals while cleaning up, so nothing is left half-stopped.
            old_int = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
            if in_main:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            try:
                _stop_tree(proc)
            finally:
                if in_main:
                    signal.signal(signal.SIGINT, old_int)
        finally:
            done.set()
            if in_main:
                signal.signal(signal.SIGTERM, previous)
            proc.stdout.close()
        watcher.join(timeout=GRACE_S + 10)
    return Outcome(proc.returncode, hang=found or None, interrupted=interrupted)
