"""The heartbeat's writer thread ends cleanly: at the interpreter's exit (atexit calls `close`)
it finishes any write in progress and writes the last state, so a finished run folder holds the
final beat and no `.rank<r>.heartbeat.json.*.tmp` left by a thread cut between its temp file
and the rename."""

from __future__ import annotations

import json
from pathlib import Path

from workloads.launch.heartbeat import Heartbeat, read_heartbeats


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
