"""The heartbeat's writer thread ends cleanly: at the interpreter's exit (atexit calls `close`)
it finishes any write in progress and writes the last state, so a finished run folder holds the
final beat and no `.rank<r>.heartbeat.json.*.tmp` left by a thread cut between its temp file
and the rename."""

from __future__ import annotations

import json
from pathlib import Path

from workloads.launch.heartbeat import Heartbeat, in_startup, read_heartbeats


def test_close_stops_the_writer_and_writes_the_last_state(tmp_path: Path) -> None:
    beat = Heartbeat.of_rank(tmp_path, 0, attempt=0, collectives=True)
    for step in range(50):  # changes faster than the writer's interval: the last is unwritten
        beat.beat(step, "backward")
    beat.beat(49, "finish")
    beat.close()
    assert not beat._thread.is_alive()
    (written,) = read_heartbeats(tmp_path / "logs").values()
    assert (written["step"], written["phase"]) == (49, "finish")
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["rank0.heartbeat.json"]
    beat.close()  # idempotent: atexit calls it again after a caller did
    assert json.loads((tmp_path / "logs" / "rank0.heartbeat.json").read_text()) == written


def test_a_refused_beat_neither_raises_nor_stops_the_writer(tmp_path: Path) -> None:
    """A full disk, or logs/ gone and a file in its place: the atomic writer's DiskError (the
    one-line error every refused write becomes) is swallowed in the writer thread and at
    close, as an OSError was; the run goes on and the watchdog judges the stale beat."""
    beat = Heartbeat.of_rank(tmp_path, 0, attempt=0, collectives=True)
    logs = tmp_path / "logs"
    for f in logs.iterdir():
        f.unlink()
    logs.rmdir()
    logs.write_text("not a folder")
    beat.beat(3, "backward")
    beat._write_if_changed()  # what the writer thread runs every interval
    assert beat._thread.is_alive()
    beat.close()
    assert logs.read_text() == "not a folder" and not beat._thread.is_alive()


def _written(beat: Heartbeat) -> dict:
    beat.close()
    return json.loads(beat.path.read_text())


def test_set_up_lasts_until_a_first_step_or_collective(tmp_path: Path) -> None:
    """The watchdog's start-up bound holds while every rank is still setting up: its first
    beat (phase init, or a script's step 0 with no phase) and no collective entered."""
    fresh = Heartbeat.of_rank(tmp_path / "a", 0, attempt=0, collectives=True)
    script = Heartbeat.of_rank(tmp_path / "b", 1, attempt=0, collectives=False)
    script.set(0, None, None, None, marker="train.py:12")
    setting_up = {0: _written(fresh), 1: _written(script)}
    assert in_startup(setting_up)
    stepping = Heartbeat.of_rank(tmp_path / "c", 1, attempt=0, collectives=True)
    stepping.beat(0, "data")
    assert not in_startup({0: setting_up[0], 1: _written(stepping)})
    # A script rank inside its first collective (DDP's broadcast at wrap): its timeout governs.
    waiting = Heartbeat.of_rank(tmp_path / "d", 1, attempt=0, collectives=False)
    waiting.set(0, None, {"name": "broadcast", "seq": 1}, None)
    assert not in_startup({0: setting_up[0], 1: _written(waiting)})
