"""torch's flight recorder on every rank of a DDP or FSDP run (dpscope's loop and `--script` runs
alike).

- The recorder is on for gloo and NCCL (`flight_recorder_env`: TORCH_FR_BUFFER_SIZE entries;
  on NCCL also its own dump on a timeout into logs/nccl_trace_rank_<r>).
- Each rank runs a `FlightDumper` daemon thread. It writes `logs/rank<r>.flightrec.json`
  (profiler.runfolder.flightrec) whenever `logs/flightrec.request` appears or changes: the
  launcher's watchdog writes it before ending a hung job, and a rank whose collective fails
  writes it (`dump_on_failure`) so that every live rank of the folder dumps too; the failing
  rank waits a few seconds for their dumps before it exits. A thread, not a signal handler:
  Python runs signal handlers only on the main thread, which may be stuck inside the
  collective; the thread needs only the GIL, which a rank blocked in gloo or NCCL releases.
- In a `--script` run, which has no dpscope heartbeat, the same thread writes the rank's
  heartbeat file (workloads.launch.heartbeat) from the step hooks' step and phase, the flight
  recorder's progress (its last enqueued and completed sequence numbers) and the main thread's
  current Python line, so the launcher's watchdog sees a script stop.

The dumps are read back, never unpickled, by profiler.runfolder.flightrec, and turned into
run.json's `error.flight_recorder` by `explain_failure` (after the job ended, in the launcher).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from profiler.runfolder.atomic import write_text_atomic
from profiler.runfolder.flightrec import DUMP_KIND, FR_REQUEST, dump_name
from workloads.launch.heartbeat import Heartbeat

__all__ = [
    "FR_BUFFER_ENTRIES",
    "FlightDumper",
    "default_timeout",
    "dump_on_failure",
    "flight_recorder_env",
    "install",
    "request_dumps",
    "wait_for_dumps",
    "watch_script_rank",
]

FR_BUFFER_ENTRIES = 2000
POLL_S = 0.5
"""How often the dumper thread looks for a request (and, in script runs, for progress)."""
PEER_WAIT_S = 5.0
"""How long a failing rank, or the watchdog, waits for the other ranks' dumps."""

_current: FlightDumper | None = None


def flight_recorder_env(logs: Path, *, nccl: bool) -> dict[str, str]:
    """The child environment that turns the recorder on (the caller keeps a value the user
    set); with `nccl` also NCCL's own dump on a timeout, into logs/nccl_trace_rank_<r>."""
    env = {"TORCH_FR_BUFFER_SIZE": str(FR_BUFFER_ENTRIES)}
    if nccl:
        env |= {
            "TORCH_NCCL_TRACE_BUFFER_SIZE": str(FR_BUFFER_ENTRIES),
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str((logs / "nccl_trace_rank_").resolve()),
        }
    return env


def _recorder_json(*, collectives: bool) -> dict | None:
    """torch's flight-recorder dump of this process as a dict (None without a process group):
    the NCCL recorder's on NCCL, the generic one (gloo) otherwise; without `collectives` only
    its status (`pg_status`, a fraction of a millisecond)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    from torch._C import _distributed_c10d as c10d  # absent from builds without distributed

    dump = c10d._dump_fr_trace_json
    if dist.get_backend() == "nccl" and hasattr(c10d, "_dump_nccl_trace_json"):
        dump = c10d._dump_nccl_trace_json
    return json.loads(dump(includeCollectives=collectives, onlyActive=False))


def _fr_progress() -> tuple[int, int] | None:
    """(last enqueued, last completed) sequence numbers summed over the process groups."""
    trace = _recorder_json(collectives=False)
    if trace is None:
        return None
    status = trace.get("pg_status", {})
    enq = sum(int(s.get("last_enqueued_collective", 0)) for s in status.values())
    done = sum(max(0, int(s.get("last_completed_collective", 0))) for s in status.values())
    return enq, done


def _main_line() -> tuple | None:
    """Where the main thread is (file, line, instruction): unchanged while it is stuck."""
    frame = sys._current_frames().get(threading.main_thread().ident)  # noqa: SLF001
    return (frame.f_code.co_filename, frame.f_lineno, frame.f_lasti) if frame else None


class FlightDumper:
    """This rank's dumper thread (see the module docstring)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        rank: int,
        run_id: str,
        attempt: int,
        progress: Callable[[], tuple[int, str | None]] | None = None,
    ) -> None:
        """`progress()` gives (step, phase) for a script run's heartbeat (phase None before the
        first step); None: the loop beats itself."""
        self.logs = Path(run_dir) / "logs"
        self.rank, self.run_id, self.attempt = rank, run_id, attempt
        self.progress = progress
        self._seen = self._request_mtime()  # a request older than this rank is not for it
        self._lock = threading.Lock()
        self._warned = False  # one line in the rank's log, not one per poll
        self._beat = None
        if progress is not None:
            self._beat = Heartbeat.of_rank(run_dir, rank, attempt=attempt, collectives=False)
        threading.Thread(target=self._loop, daemon=True, name="flightrec").start()

    def _request_mtime(self) -> float:
        try:
            return (self.logs / FR_REQUEST).stat().st_mtime
        except OSError:
            return 0.0

    def _loop(self) -> None:
        while True:
            time.sleep(POLL_S)
            try:
                mtime = self._request_mtime()
                if mtime > self._seen:
                    self._seen = mtime
                    self.dump("requested")
                if self._beat is not None:
                    self._tick()
            except Exception as err:  # noqa: BLE001 - the recorder must never take the rank down
                if not self._warned:
                    self._warned = True
                    print(f"[rank{self.rank}] flight recorder: {type(err).__name__}: {err}")

    def _tick(self) -> None:
        """The script run's heartbeat: changes whenever the step, the phase, the recorder's
        progress or the main thread's line does."""
        step, phase = self.progress() if self.progress else (0, None)
        fr = _fr_progress()
        started = {"name": "collective", "seq": fr[0]} if fr and fr[0] else None
        finished = {"name": "collective", "seq": fr[1]} if fr and fr[1] else None
        self._beat.set(step, phase, started, finished, marker=_main_line())

    def dump(self, reason: str) -> Path | None:
        """Write this rank's dump now (None without a process group)."""
        with self._lock:
            trace = _recorder_json(collectives=True)
            if trace is None:
                return None
            path = self.logs / dump_name(self.rank)
            doc = json.dumps(
                {
                    "kind": DUMP_KIND,
                    "run_id": self.run_id,
                    "attempt": self.attempt,
                    "rank": self.rank,
                    "world_size": int(os.environ.get("WORLD_SIZE", "1")),
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "reason": reason,
                    "dumped_at": time.time(),
                    "trace": trace,
                }
            )
            write_text_atomic(path, doc, fsync=False)  # compact: 2000 entries are MBs
            return path


def install(
    run_dir: Path,
    *,
    rank: int,
    run_id: str,
    attempt: int,
    progress: Callable[[], tuple[int, str | None]] | None = None,
) -> FlightDumper:
    """Start this process's dumper (once)."""
    global _current
    if _current is None:
        _current = FlightDumper(
            run_dir, rank=rank, run_id=run_id, attempt=attempt, progress=progress
        )
    return _current


def default_timeout(seconds: float) -> None:
    """Make `seconds` the timeout of every process group created without one (a script's
    own `init_process_group(..., timeout=...)` keeps its value): torch's default for groups
    without a timeout is `_get_default_timeout(backend)`, replaced here."""
    from datetime import timedelta

    import torch.distributed.distributed_c10d as c10d

    if hasattr(c10d, "_get_default_timeout"):
        c10d._get_default_timeout = lambda backend: timedelta(seconds=seconds)


def watch_script_rank(
    run_dir: Path, *, rank: int, timeout_s: float | None, progress: Callable
) -> None:
    """A `--script` DDP rank (WORLD_SIZE > 1): `--collective-timeout` as the process groups'
    default timeout, and the dumper thread with the heartbeat the watchdog reads."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return
    if timeout_s:
        default_timeout(timeout_s)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    install(run_dir, rank=rank, run_id=Path(run_dir).name, attempt=attempt, progress=progress)


def request_dumps(logs: Path, reason: str) -> float:
    """Ask every rank writing into `logs` to dump; returns the request's time."""
    path = Path(logs) / FR_REQUEST
    write_text_atomic(path, json.dumps({"reason": reason, "time": time.time()}), fsync=False)
    return path.stat().st_mtime


def wait_for_dumps(logs: Path, ranks: list[int], since: float, timeout_s: float) -> list[int]:
    """Poll (bounded) until every rank in `ranks` has a dump newer than `since`; returns the
    ranks still without one."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = []
        for r in ranks:
            try:
                if (Path(logs) / dump_name(r)).stat().st_mtime < since:
                    missing.append(r)
            except OSError:
                missing.append(r)
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.2)


def dump_on_failure(reason: str) -> None:
    """A rank's collective (or anything) failed: dump, ask the other ranks to, and wait a few
    seconds for them, before the rank exits and torchrun ends its peers."""
    if _current is None:
        return
    try:
        if _current.dump(reason) is None:
            return
        since = request_dumps(_current.logs, f"rank {_current.rank}: {reason}")
        _current._seen = since  # our own request: already dumped
        world = int(os.environ.get("WORLD_SIZE", "1"))
        others = [r for r in range(world) if r != _current.rank]
        wait_for_dumps(_current.logs, others, since, PEER_WAIT_S)
    except Exception as err:  # noqa: BLE001 - the rank's error record matters more than its dump
        print(f"[rank{_current.rank}] flight recorder: no dump ({type(err).__name__}: {err})")
