"""A failed run's `error`, explained from the ranks' flight-recorder dumps and heartbeats.

After a DDP job failed, the launcher reads logs/ (profiler.runfolder.flightrec, frdiag): the
first collective where the ranks disagree becomes `error.flight_recorder`, and the message
leads with it, joined with the stuck rank's last heartbeat (dpscope's loop: its step and
phase; a script run: the step hooks'):

    rank 1 never entered all_reduce #57 (ranks 0, 2, 3 waited 300 s); its last phase: data,
    step 12 — <the first failing rank's own error>

- **hang**: some ranks never entered the collective the others waited in. The stuck rank
  becomes `error.rank`.
- **desync**: the ranks entered the same collective with different ops, sizes or dtypes, or
  gloo aborted a rank with its "Received data size doesn't match expected size ... Is there a
  distributed collective mismatch in your code?" (gloo kills that rank at once, so it leaves
  no dump of its own; its log line names the mismatch). `desync` then lists the dumped ranks'
  op and sizes at that collective, and for the aborted rank what gloo's line says: the bytes
  it was sent and the bytes its buffer held.
- A run that failed otherwise (a rank that raised, was killed or ran out of memory: the others
  then wait for it, a consequence) keeps its kind; the recorder's view is appended to the
  message.

Dump files that could not be read, and ranks that left none, are listed one line each in
`error.flight_recorder.problems`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from profiler.runfolder.flightrec import Dump, read_dumps
from profiler.runfolder.frdiag import diagnose_dumps, ranks_text, used
from workloads.launch.faults import timed_out
from workloads.launch.heartbeat import read_heartbeats

__all__ = ["GLOO_MISMATCH", "explain_failure"]

GLOO_MISMATCH = "Is there a distributed collective mismatch in your code?"
"""The end of gloo's abort message when a rank receives more data than its tensor holds."""
_SCAN_LINES = 200  # of each rank's log, from its end
# gloo's enforce line: `op.preamble.length <= op.nbytes. 1000 vs 500. Received data size ...`:
# the bytes the peer sent, then the bytes the aborted rank's buffer held for them.
_GLOO_BYTES = re.compile(r"(\d+) vs (\d+)\. Received data size")


def _mismatch_line(path: Path) -> str | None:
    try:
        lines = path.read_text(errors="replace").splitlines()[-_SCAN_LINES:]
    except OSError:
        return None
    return next((line.strip()[-300:] for line in lines if GLOO_MISMATCH in line), None)


def _mismatch(logs: Path, world_size: int, error: dict) -> dict[int, str]:
    """{rank: gloo's mismatch line}. gloo aborts from C++, so the line reaches the launcher's
    log (torchrun relays the rank's stderr) rather than the rank's own: there it is the rank
    that died of SIGABRT's (error.rank when the run failed as `killed` with exit code -6)."""
    out = {r: line for r in range(world_size) if (line := _mismatch_line(logs / f"rank{r}.log"))}
    if not out and error.get("exit_code") == -6 and isinstance(error.get("rank"), int):
        line = _mismatch_line(logs / "launcher.log")
        if line:
            out[error["rank"]] = line
    return out


def _aborted_desync(dumps: dict[int, Dump], fr: dict, aborted: dict[int, str]) -> list[dict]:
    """`desync` for a collective gloo aborted a rank in: each dumped rank's op, sizes and dtypes
    at that collective, and each aborted rank's only record of it, gloo's line: the bytes it
    was sent and the bytes its buffer held (`op` null: it died before any dump)."""
    out = []
    for r, dump in sorted(dumps.items()):
        at = [e for e in dump.entries if (e.pg, e.seq) == (fr.get("process_group"), fr.get("seq"))]
        out += [used(r, e) for e in at[-1:]]
    for r, line in sorted(x for x in aborted.items() if x[0] not in dumps):  # a dump says more
        sent = _GLOO_BYTES.search(line)
        out.append(
            {
                "rank": r,
                "op": None,
                "received_bytes": int(sent[1]) if sent else None,
                "expected_bytes": int(sent[2]) if sent else None,
            }
        )
    return sorted(out, key=lambda x: x["rank"])


def _hung(error: dict) -> bool:
    """A hang: the watchdog's or a timeout's, also when the failed rank's record has no kind (a
    script's records say `crash` for any exception; its message says it timed out)."""
    kind = error.get("kind")
    return kind == "hang" or (kind == "crash" and timed_out(str(error.get("message") or "")))


def _since(record: dict) -> float | None:
    try:
        return datetime.fromisoformat(str(record.get("created_at"))).timestamp()
    except ValueError:
        return None


def _last_beat(logs: Path, rank: int) -> dict:
    """The stuck rank's last step and phase, from its heartbeat ({} without one)."""
    beat = read_heartbeats(logs).get(rank) or {}
    if beat.get("step") is None or not beat.get("phase"):  # a script before its first step
        return {}
    return {"step": beat["step"], "phase": beat["phase"]}


def explain_failure(
    run_dir: Path, error: dict, record: dict, *, tail: Callable[[Path], list[str]]
) -> dict:
    """`error` with `flight_recorder` and, where the dumps show one, the hang or desync named
    (see the module docstring); unchanged when there is no dump and no gloo mismatch line.
    `tail(path)` gives the last lines of a log (runlog's)."""
    config = record.get("config") or {}
    world = config.get("world_size") if isinstance(config.get("world_size"), int) else None
    if not world or world < 2 or error.get("kind") == "interrupted":
        return error
    logs = Path(run_dir) / "logs"
    dumps, problems = read_dumps(logs, run_id=record.get("run_id"), since=_since(record))
    fr = diagnose_dumps(dumps, world_size=world, problems=problems)
    aborted = _mismatch(logs, world, error)
    if fr is None and not aborted:
        return error
    out = dict(error)
    fr = fr or {"message": None, "problems": problems, "no_dump": list(range(world))}
    out["flight_recorder"] = {**fr, "aborted": {str(r): line for r, line in aborted.items()}}
    original = error.get("message") or ""
    if aborted or fr.get("desync"):
        out["kind"] = "desync"
        text = fr.get("message") or "no flight-recorder dump"
        if aborted:
            out["flight_recorder"]["desync"] = _aborted_desync(dumps, fr, aborted)
            at = f" at {fr['collective']} #{fr['seq']}" if fr.get("seq") else ""
            why = next(iter(aborted.values())).rsplit("] ", 1)[-1]
            text = f"{at}: gloo aborted {ranks_text(list(aborted))} ({why}); {text}"
        out["message"] = f"desync{text if aborted else ': ' + text} — {original}"
    elif fr.get("never_entered") and _hung(error):
        stuck = fr["never_entered"][0]
        beat = _last_beat(logs, stuck)
        out.update(kind="hang", rank=stuck, ranks=fr["never_entered"], **beat)
        where = f"; its last phase: {beat['phase']}, step {beat['step']}" if beat else ""
        out["message"] = f"{fr['message']}{where} — {original}"
        out["log_tail"] = tail(logs / f"rank{stuck}.log") or error.get("log_tail", [])
    elif fr.get("message"):
        out["message"] = f"{original}; flight recorder: {fr['message']}"
    return out
