"""Per-rank heartbeats (`logs/rank<r>.heartbeat.json`) and what a stalled job's beats say.

Each rank rewrites its heartbeat file at every phase boundary: attempt, step, phase, the last
collective it started and finished (with this rank's sequence number of it) and the time. Every
rank enters the same collectives in the same order, so equal sequence numbers on two ranks are
the same collective. A beat only updates this process's state (no I/O on the training thread);
a daemon thread rewrites the file at most every WRITE_INTERVAL_S when the state changed, with
profiler.runfolder.atomic (temp file + replace, so a reader never sees half a file) but no fsync (a beat
lost to a power cut costs nothing; file I/O per phase would cost tiny models a large share of
their step time). `time` is when the state last changed, so a stuck rank's file stops changing
even though its writer thread lives on.

`HeartbeatCallback` beats at the training loop's callback points (profiler.callbacks): the
phase it names is the one the rank is entering.

The launcher's watchdog (workloads.launch.supervise) reads the files; when nothing has moved for the
collective timeout it ends the job, and `diagnose_hang` turns the last beats into run.json's
`error`: the rank(s) that stopped first and the collective the others were waiting in.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from pathlib import Path

from profiler.callbacks import Callback, StepState
from profiler.runfolder.atomic import write_text_atomic
from profiler.runfolder.errors import DiskError

__all__ = [
    "HEARTBEAT_PHASES",
    "Heartbeat",
    "HeartbeatCallback",
    "diagnose_hang",
    "in_startup",
    "latest_change",
    "read_heartbeats",
]

# Phase order within one step; a later phase is more progress.
HEARTBEAT_PHASES = (
    "init",
    "data",
    "forward",
    "backward",
    "optimizer",
    "checkpoint",
    "eval",
    "finish",
)
# The one collective of each phase that has one (DDP's bucketed gradient allreduce of a
# backward counts as one collective).
COLLECTIVES = {
    "backward": "allreduce (DDP gradient buckets)",
    "checkpoint": "gather_object (checkpoint)",
    "eval": "all_reduce (eval sums)",
    "finish": "gather_object (step rows)",
}


WRITE_INTERVAL_S = 0.5
"""How often the writer thread looks for a new state to write."""


class Heartbeat:
    """This rank's heartbeat: `beat`/`tick` record progress, a daemon thread writes the file."""

    def __init__(self, path: Path, *, rank: int, attempt: int, collectives: bool) -> None:
        self.path = path
        self.rank, self.attempt, self.collectives = rank, attempt, collectives
        self.seq = 0
        self.started: dict | None = None
        self.finished: dict | None = None
        self.step, self.phase = 0, "init"
        self.changed_at = time.time()
        self.version = self.written = 0
        self._observed: tuple | None = None  # what `set` saw last
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._write()  # the first beat is on disk before training starts
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._writer, daemon=True, name="heartbeat")
        self._thread.start()
        # A daemon thread is cut wherever it is when the interpreter exits: between its temp file
        # and the rename, that would leave logs/.rank<r>.heartbeat.json.*.tmp in the run folder.
        atexit.register(self.close)

    @classmethod
    def of_rank(cls, run_dir: Path, rank: int, *, attempt: int, collectives: bool) -> Heartbeat:
        """`logs/rank<r>.heartbeat.json` of `run_dir`, with a first beat (phase init)."""
        beat = cls(
            run_dir / "logs" / f"rank{rank}.heartbeat.json",
            rank=rank,
            attempt=attempt,
            collectives=collectives,
        )
        return beat

    def beat(self, step: int, phase: str) -> None:
        """Record entering `phase` of `step`; a phase that holds a collective starts it here."""
        with self._lock:
            if self.started and (not self.finished or self.finished["seq"] < self.started["seq"]):
                # The previous phase's collective returned, or we would not be here.
                self.finished = dict(self.started)
            self.step, self.phase = step, phase
            if self.collectives and phase in COLLECTIVES:
                self.seq += 1
                self.started = {"name": COLLECTIVES[phase], "seq": self.seq}
            self.changed_at = time.time()
            self.version += 1

    def set(
        self,
        step: int,
        phase: str | None,
        started: dict | None,
        finished: dict | None,
        *,
        marker: object = None,
    ) -> None:
        """Progress observed from outside the loop (a script run's flight-recorder thread:
        workloads.launch.flightrec): the beat's time moves only when the step, phase,
        collectives or `marker` (where the main thread is) changed."""
        state = (step, phase, started, finished, marker)
        with self._lock:
            if state == self._observed:
                return
            self._observed = state
            self.step, self.phase, self.started, self.finished = step, phase, started, finished
            self.changed_at = time.time()
            self.version += 1

    def tick(self) -> None:
        """Progress inside a long phase (eval batches): same step and phase, a new time."""
        with self._lock:
            self.changed_at = time.time()
            self.version += 1

    def _writer(self) -> None:
        while not self._stop.wait(WRITE_INTERVAL_S):
            self._write_if_changed()

    def _write_if_changed(self) -> None:
        if self.version != self.written:
            try:
                self._write()
            except (OSError, DiskError):  # a full disk must not kill the rank (the writers
                pass  # say so as a DiskError); the watchdog may say hang

    def close(self) -> None:
        """Stop the writer thread (waiting for a write in progress), then write the last state if
        it changed since. Called at the interpreter's exit; idempotent."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * WRITE_INTERVAL_S + 5)
        self._write_if_changed()

    def _write(self) -> None:
        with self._lock:
            version = self.version
            beat = {
                "rank": self.rank,
                "pid": os.getpid(),
                "attempt": self.attempt,
                "step": self.step,
                "phase": self.phase,
                "collective_started": self.started,
                "collective_finished": self.finished,
                "time": self.changed_at,
            }
        write_text_atomic(self.path, json.dumps(beat), fsync=False)
        self.written = version


class HeartbeatCallback(Callback):
    """Beats at the loop's callback points: `data` at step start, `forward` once the batch is
    there, `backward` before the backward that all-reduces, `optimizer` after it, `checkpoint`,
    `eval` at the epoch's end (and a tick per eval batch), `finish` at the run's end."""

    def __init__(self, beat: Heartbeat) -> None:
        self.heartbeat = beat

    def step_start(self, state: StepState) -> None:
        self.heartbeat.beat(state.step, "data")

    def after_data(self, state: StepState) -> None:
        self.heartbeat.beat(state.step, "forward")

    def after_forward(self, state: StepState) -> None:
        self.heartbeat.beat(state.step, "backward")

    def after_backward(self, state: StepState) -> None:
        self.heartbeat.beat(state.step, "optimizer")

    def checkpoint(self, state: StepState) -> None:
        self.heartbeat.beat(state.step, "checkpoint")

    def epoch_end(self, state: StepState) -> None:
        self.heartbeat.beat(state.step, "eval")

    def eval_batch(self, state: StepState) -> None:
        self.heartbeat.tick()

    def run_end(self, state: StepState) -> None:
        self.heartbeat.beat(state.step, "finish")


def read_heartbeats(logs: Path) -> dict[int, dict]:
    """{rank: last beat} of every readable heartbeat file in `logs` (unreadable ones skipped)."""
    beats = {}
    for p in sorted(logs.glob("rank*.heartbeat.json")):
        try:
            beat = json.loads(p.read_text())
            beats[int(beat["rank"])] = beat
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return beats


def _progress(beat: dict) -> tuple:
    phase = beat.get("phase")
    return (
        beat.get("attempt", 0),
        beat.get("step", 0),
        HEARTBEAT_PHASES.index(phase) if phase in HEARTBEAT_PHASES else -1,
    )


def _waiting(beat: dict) -> dict | None:
    """The collective this rank is inside (started, not finished), or None."""
    started, finished = beat.get("collective_started"), beat.get("collective_finished")
    if started and (not finished or finished.get("seq", 0) < started.get("seq", 0)):
        return started
    return None


def diagnose_hang(beats: dict[int, dict], *, now: float | None = None) -> dict:
    """run.json `error` fields for a hung job from the ranks' last heartbeats.

    The stuck ranks are those with the least progress (attempt, step, phase); among equals, those
    not inside a collective; `rank` is the one whose last beat is oldest. Every other rank is
    listed in `waiting` with the collective it was inside and for how long.
    """
    now = time.time() if now is None else now
    if not beats:
        return {"kind": "hang", "rank": None, "step": None, "phase": None, "waiting": []}
    last = max(beats.values(), key=lambda b: b.get("attempt", 0))["attempt"]
    beats = {r: b for r, b in beats.items() if b.get("attempt", 0) == last}
    least = min(_progress(b) for b in beats.values())
    stuck = [r for r, b in beats.items() if _progress(b) == least]
    outside = [r for r in stuck if _waiting(beats[r]) is None]
    stuck = outside or stuck
    first = min(stuck, key=lambda r: beats[r].get("time", 0))
    waiting = [
        {
            "rank": r,
            "step": b.get("step"),
            "phase": b.get("phase"),
            "collective": (_waiting(b) or {}).get("name"),
            "seq": (_waiting(b) or {}).get("seq"),
            "waited_s": round(now - b.get("time", now), 1),
        }
        for r, b in sorted(beats.items())
        if r not in stuck
    ]
    head = beats[first]
    message = (
        f"rank{'s' if len(stuck) > 1 else ''} {', '.join(map(str, sorted(stuck)))} stopped "
        f"progressing at step {head.get('step')} (phase {head.get('phase')})"
    )
    inside = [w for w in waiting if w["collective"]]
    if inside:
        w = inside[0]
        others = ", ".join(str(x["rank"]) for x in inside)
        message += f"; rank(s) {others} waited in {w['collective']} #{w['seq']}"
    return {
        "kind": "hang",
        "message": message,
        "rank": first,
        "ranks": sorted(stuck),
        "step": head.get("step"),
        "phase": head.get("phase"),
        "collective": inside[0]["collective"] if inside else None,
        "waiting": waiting,
    }


def in_startup(beats: dict[int, dict]) -> bool:
    """Every rank that has beaten is still before its first step (phase init, or no phase yet in
    a script run, at step 0) and inside no collective: setting up, where no collective timeout
    can fire first and a cold start is slow."""
    return all(
        b.get("phase") in ("init", None) and not b.get("step") and _waiting(b) is None
        for b in beats.values()
    )


def latest_change(beats: dict[int, dict]) -> float | None:
    """Time of the most recent beat of any rank (None without beats)."""
    return max((b.get("time", 0.0) for b in beats.values()), default=None)
