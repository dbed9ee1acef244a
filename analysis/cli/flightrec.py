"""`dpscope flightrec RUN`: read a run's flight-recorder dumps (docs/guides/multi-node-slurm.md).

Per rank: the dump file, how many collectives it holds and its last one (sequence number, op,
sizes, whether it completed); then the first collective where the ranks disagree
(profiler.runfolder.frdiag). Torch is never imported and no dump is unpickled into code. A dump
that cannot be used (truncated, from another job, a rank outside the world) and a rank without
a dump are one line each; only a RUN with no dump at all is an error.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.cli.table import say
from profiler.runfolder.errors import InputError
from profiler.runfolder.flightrec import read_dumps
from profiler.runfolder.frdiag import diagnose_dumps
from profiler.runfolder.layout import RUN_JSON
from profiler.runfolder.records import read_record

__all__ = ["add_parser", "print_flightrec", "run_flightrec"]


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    f = sub.add_parser("flightrec", help="a run's flight-recorder dumps: where the ranks disagree")
    f.add_argument("run", type=Path, metavar="RUN", help="a run folder (or its logs/ folder)")
    return f


def _record(run_dir: Path, problems: list[str]) -> tuple[str | None, int | None, float | None]:
    """(run_id, world size, created_at epoch s) from run.json; Nones (and a line) without one."""
    path = run_dir / RUN_JSON
    if not path.is_file():
        return None, None, None
    try:
        rec, raw = read_record(path)
    except Exception as err:  # noqa: BLE001 - a bad run.json costs the job check, not the dumps
        problems.append(f"{path}: unreadable ({str(err)[:120]}) — dumps not checked against it")
        return None, None, None
    from datetime import datetime

    try:
        created = datetime.fromisoformat(str(raw.get("created_at"))).timestamp()
    except ValueError:
        created = None
    return raw.get("run_id"), rec.config.world_size, created


def run_flightrec(path: Path) -> dict:
    """The flight-recorder view of run folder `path` (see the module docstring)."""
    path = Path(path)
    run_dir = path.parent if path.name == "logs" else path
    logs = run_dir / "logs"
    if not logs.is_dir():
        raise InputError(path, "has no logs/ folder", "pass a run folder (runs/<run_id>)")
    problems: list[str] = []
    run_id, world, created = _record(run_dir, problems)
    dumps, unread = read_dumps(logs, run_id=run_id, since=created)
    problems += unread
    if not dumps:
        reasons = "; ".join(problems[:3]) or "no rank<r>.flightrec.json or nccl_trace_rank_<r>"
        raise InputError(
            logs,
            f"no usable flight-recorder dump ({reasons})",
            "dumps are written when a DDP run's collective fails or its watchdog fires",
        )
    diagnosis = diagnose_dumps(dumps, world_size=world, problems=problems)
    ranks = []
    for r, d in sorted(dumps.items()):
        last = max(d.entries, key=lambda e: (e.pg == "0", e.seq)) if d.entries else None
        ranks.append(
            {
                "rank": r,
                "file": d.file,
                "entries": len(d.entries),
                "reason": d.reason,
                "last": None
                if last is None
                else {
                    "process_group": last.pg,
                    "seq": last.seq,
                    "op": last.op,
                    "input_sizes": last.input_sizes,
                    "dtypes": last.dtypes,
                    "completed": last.completed,
                },
            }
        )
    return {
        "run_dir": str(run_dir),
        "run_id": run_id,
        "world_size": world,
        "ranks": ranks,
        "diagnosis": diagnosis,
        "warnings": [],
    }


def print_flightrec(result: dict) -> None:
    say(f"flight recorder: {result['run_dir']}  world_size={result['world_size']}")
    for r in result["ranks"]:
        last = r["last"]
        tail = (
            "no collective"
            if last is None
            else (
                f"last {last['op']} #{last['seq']} (group {last['process_group']}) input sizes "
                f"{str(last['input_sizes'])[:60]} {'ended' if last['completed'] else 'still in flight'}"
            )
        )
        say(f"  rank {r['rank']}: {r['file']}, {r['entries']} collectives; {tail}")
    diagnosis = result["diagnosis"] or {}
    if diagnosis.get("message"):
        say(f"\n{diagnosis['message']}")
    for line in diagnosis.get("problems", []):
        say(f"warning: {line}")
