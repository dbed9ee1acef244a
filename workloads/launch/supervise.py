"""Run the training command under supervision: relay its output, watch the ranks' heartbeats,
and never leave a process behind.

- Output goes raw (progress bars work) to the console and to `logs/launcher.log`.
- A watchdog thread reads `logs/rank<r>.heartbeat.json` every second. Once the first beat has
  appeared, if no rank's beat changes for `stall_s` seconds (at least STARTUP_S while every
  rank is still setting up, before its first step) the job is declared hung: the
  ranks' last beats are turned into the hang diagnosis, every rank is asked to dump its flight
  recorder (workloads.launch.flightrec, waited for a few seconds) and the process tree is ended.
- Ctrl-C (SIGINT) or SIGTERM to the launcher ends the process tree too, and the outcome says
  `interrupted`. torchrun starts each rank in a session of its own, so a signal to torchrun's
  process group does not reach them: the tree is snapshotted first, torchrun is asked to stop
  its workers (SIGTERM), and whatever is still alive after the grace period is SIGKILLed.
- The launcher waits for the job, not for what the job left behind: once the direct child has
  exited, any process it (or a rank) started that still runs (a daemon, a stray background
  job; on Linux the launcher is their subreaper, so even a double-forked one is found) gets
  LEFTOVER_GRACE_S to end, then a warning naming it, SIGTERM and SIGKILL (`Outcome.leftovers`).
- The child runs under workloads.launch.guard: if the launcher itself is killed (even by
  SIGKILL) the job gets SIGTERM, so no training outlives its launcher.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from profiler.runfolder.errors import disk_writes
from workloads.launch.child import set_subreaper
from workloads.launch.flightrec import PEER_WAIT_S, request_dumps, wait_for_dumps
from workloads.launch.guard import guarded
from workloads.launch.heartbeat import diagnose_hang, in_startup, read_heartbeats

__all__ = ["WATCHDOG_GRACE_S", "Outcome", "run_supervised"]

GRACE_S = 30.0
"""How long torchrun gets to stop its workers before everything left is SIGKILLed."""
WATCHDOG_GRACE_S = 10.0
"""The watchdog waits this much longer than --collective-timeout, so that a rank's own timeout
error (and its flight-recorder dump) comes first when a rank hangs in a collective."""
STARTUP_S = 120.0
"""The least time the watchdog allows without progress while every rank is still before its
first step (heartbeat.in_startup): model, data and process-group set-up run no collective whose
timeout would fire first, and a cold start (first imports compiling their bytecode, several jobs
starting at once on a small machine) can take longer than a short --collective-timeout."""
LEFTOVER_GRACE_S = 6.0
"""How long processes left by a finished job get to end by themselves (DataLoader workers of a
rank that exited at once notice within 5 s)."""


@dataclass(frozen=True)
class Outcome:
    """How the supervised command ended."""

    returncode: int
    hang: dict | None = None
    """diagnose_hang's fields when the watchdog ended the job."""
    interrupted: str | None = None
    """SIGINT or SIGTERM when the launcher was interrupted."""
    leftovers: tuple[str, ...] = ()
    """`pid N (command)` of each process the job left running after it exited (then ended)."""


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
    proc: subprocess.Popen,
    logs: Path,
    stall_s: float,
    done: threading.Event,
    found: dict,
    seen: set[psutil.Process],
) -> None:
    last_sig, last_change = None, time.monotonic()
    while not done.wait(1.0) and proc.poll() is None:
        seen.update(_descendants(proc.pid))  # where no subreaper exists: what may be left over
        beats = read_heartbeats(logs)
        if not beats:
            last_change = time.monotonic()  # start-up: rendezvous has its own timeout
            continue
        sig = _signature(beats)
        bound = max(stall_s, STARTUP_S) if in_startup(beats) else stall_s
        if sig != last_sig:
            last_sig, last_change = sig, time.monotonic()
        elif time.monotonic() - last_change > bound:
            found.update(diagnose_hang(beats))
            print(
                f"\nworkloads.launch: no heartbeat progress for {bound:.0f} s — {found['message']}; "
                "stopping the job",
                file=sys.stderr,
                flush=True,
            )
            if len(beats) > 1:  # every live rank dumps its flight recorder first
                since = request_dumps(logs, f"watchdog: no progress for {bound:.0f} s")
                wait_for_dumps(logs, sorted(beats), since, PEER_WAIT_S)
            _stop_tree(proc)
            return


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _describe(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline()) or p.name()
    except psutil.Error:
        cmd = "?"
    return f"pid {p.pid} ({cmd[:120]})"


def _live(p: psutil.Process) -> bool:
    """Running and not a zombie; a zombie child of ours (an orphan we inherited) is reaped."""
    try:
        if p.status() != psutil.STATUS_ZOMBIE:
            return p.is_running()
        with contextlib.suppress(psutil.Error, ChildProcessError):
            p.wait(timeout=0)
    except psutil.Error:
        pass
    return False


def _end_leftovers(before: set[int], seen: set[psutil.Process]) -> tuple[str, ...]:
    """After the job's direct child exited: end what it left running (the module docstring)."""
    candidates = seen | {p for p in _descendants(os.getpid()) if p.pid not in before}
    alive = [p for p in candidates if _live(p)]
    if not alive:
        return ()
    _, alive = psutil.wait_procs(alive, timeout=LEFTOVER_GRACE_S)
    if not alive:
        return ()
    names = tuple(_describe(p) for p in sorted(alive, key=lambda p: p.pid))
    print(
        f"workloads.launch: warning: the job left {len(names)} process(es) running after it "
        f"exited: {'; '.join(names)} — ending them (a script's background processes must end "
        "with it)",
        file=sys.stderr,
        flush=True,
    )
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(alive, timeout=LEFTOVER_GRACE_S)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    return names


class _Relay:
    """Copies the job's output to the console and the log from a thread of its own, so the
    launcher waits for the process, not for the pipe (a leftover may hold it open). A log the
    disk refuses stops being written; the console still gets everything."""

    def __init__(self, source: int, log) -> None:
        self.source, self.log = source, log
        self.thread = threading.Thread(target=self._run, daemon=True, name="relay")
        self.thread.start()

    def _run(self) -> None:
        while chunk := os.read(self.source, 65536):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            if self.log is not None:
                try:
                    self.log.write(chunk)
                except (OSError, ValueError):  # full disk, or the log already closed
                    self.log = None

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        self.log = None  # a relay still blocked (an unkillable leftover) writes no more


def run_supervised(
    cmd: list[str], *, env: dict, log_path: Path, logs: Path, stall_s: float
) -> Outcome:
    """Run `cmd` in this process's working folder, relaying its output to the console and
    `log_path`; see the module docstring."""
    found: dict = {}
    seen: set[psutil.Process] = set()
    done = threading.Event()
    interrupted = None
    set_subreaper()
    before = {p.pid for p in _descendants(os.getpid())}
    cmd = guarded(cmd)
    with disk_writes(log_path):
        log = open(log_path, "ab")  # noqa: SIM115 - closed below, after the relay
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        relay = _Relay(proc.stdout.fileno(), log)
        watcher = threading.Thread(
            target=_watch, args=(proc, logs, stall_s, done, found, seen), daemon=True
        )
        watcher.start()
        interrupted = _wait(proc)
        done.set()
        leftovers = _end_leftovers(before, seen)
        relay.join(timeout=5.0)
        proc.stdout.close()
        watcher.join(timeout=GRACE_S + 10)
    finally:
        log.close()
    return Outcome(
        proc.returncode, hang=found or None, interrupted=interrupted, leftovers=leftovers
    )


def _wait(proc: subprocess.Popen) -> str | None:
    """Wait for `proc`; on Ctrl-C or SIGTERM stop its tree and say which signal it was."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
        proc.wait()
        return None
    except (KeyboardInterrupt, _Terminated) as exc:
        interrupted = "SIGINT" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        print(f"\nworkloads.launch: {interrupted}: stopping the job", file=sys.stderr, flush=True)
        # Ignore further signals while cleaning up, so nothing is left half-stopped.
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
        if in_main:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            _stop_tree(proc)
        finally:
            if in_main:
                signal.signal(signal.SIGINT, old_int)
        return interrupted
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
