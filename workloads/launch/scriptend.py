"""How a `--script` run ended: its record, its exit code and the lines the launcher prints.

After the ranks have ended, the launcher reads their parts (profiler.runfolder.parts) and decides:

- **interrupted** (`status: interrupted`): SIGINT or SIGTERM reached the launcher (Ctrl-C, a
  signal to the process group, or its own watchdog), or, with every rank's part there and none
  failed by itself, a signal reached a rank. `error` = `{kind: interrupted, signal, message,
  rank, exit_code, log_tail: []}`; the steps, traces and metrics the ranks recorded are kept.
  dpscope exits 130 for SIGINT and 143 for SIGTERM (128 + the signal's number).
- **failed**: a rank raised, exited non-zero or was killed, or the watchdog ended a hang
  (runlog.finalize gives `error`);
  dpscope exits with that first failing rank's exit code (128 + N for a rank killed by signal
  N; 1 when unknown).
- **ok**: otherwise; exit code 0. A run stopped by `--max-steps` is ok, with `stop_reason`.
"""

from __future__ import annotations

import shlex
import signal
from pathlib import Path
from typing import Any

import msgspec

from profiler.runfolder.layout import RUN_JSON, utc_now, write_run_json
from profiler.runfolder.parts import assemble, first_signal, read_parts
from profiler.runfolder.records import read_record_to_update
from profiler.runfolder.schema import ErrorInfo, RankPart, RunRecord
from workloads.launch.child import PACKAGE_ROOT
from workloads.launch.runlog import finalize
from workloads.launch.supervise import Outcome

__all__ = ["end_script_run", "exit_code", "next_lines", "print_summary", "signal_of"]


def signal_of(
    outcome: Outcome, parts: list[RankPart], expected: int
) -> tuple[str | None, RankPart | None]:
    """(the signal that interrupted the run or None, the part of the rank it reached first)."""
    first = first_signal(parts)
    if outcome.interrupted:
        return outcome.interrupted, first
    if outcome.hang:  # the watchdog's SIGTERM: a hang, which finalize diagnoses
        return None, None
    if len(parts) < expected or any(p.ended == "failed" for p in parts):
        return None, None  # a rank failed or was killed: the signals the others got are its echo
    return (first.signal, first) if first else (None, None)


def _interrupted_error(name: str, rank: int | None, parts: list[RankPart]) -> ErrorInfo:
    """`error` of an interrupted run; `rank` the one the signal reached (None: the launcher)."""
    steps = max((len(p.rows) for p in parts), default=0)
    where = " (at the launcher)" if rank is None else f" on rank {rank}"
    return ErrorInfo.written(
        kind="interrupted",
        signal=name,
        message=f"interrupted by {name}{where} after {steps} step(s): every rank kept the "
        "steps, traces and metrics it had recorded",
        rank=rank,
        exit_code=128 + int(signal.Signals[name]),
        log_tail=[],
    )


def end_script_run(
    run_dir: Path, outcome: Outcome, *, expected: int, launcher_log: Path, **assembly: Any
) -> RunRecord:
    """Assemble the ranks' parts into the run folder and give it its final status (see the
    module docstring); return the run record. `assembly`: profiler.runfolder.parts.assemble's
    keywords."""
    parts = read_parts(run_dir)  # what the ranks recorded, also of a failed or stopped run
    name, first = signal_of(outcome, parts, expected)
    if name is not None:
        rank = None if outcome.interrupted or first is None else first.rank
        error = _interrupted_error(name, rank, parts)
        if parts:
            return assemble(run_dir, parts, status="interrupted", error=error, **assembly)
        record = msgspec.structs.replace(
            read_record_to_update(run_dir / RUN_JSON),
            status="interrupted",
            error=error,
            finished_at=utc_now(),
        )
        write_run_json(run_dir, record)
        return record
    if parts:
        status = "ok" if outcome.returncode == 0 else "running"  # finalize makes it failed
        assemble(run_dir, parts, status=status, **assembly)
    return finalize(run_dir, outcome, launcher_log)


def exit_code(record: RunRecord) -> int:
    """dpscope's exit code for a finished script run (see the module docstring)."""
    if record.status == "ok":
        return 0
    code = record.error.exit_code if record.error else None
    if not isinstance(code, int) or code == 0:
        return 1
    return 128 - code if code < 0 else code


def next_lines(runs_dir: str | Path) -> list[str]:
    """What to run next: `dpscope report`; the make target too when run in dpscope's own
    repository (where its Makefile is)."""
    runs = shlex.quote(str(runs_dir))
    in_repo = Path.cwd().resolve() == PACKAGE_ROOT and (PACKAGE_ROOT / "Makefile").is_file()
    make = f"   (make report RUNS={runs})" if in_repo else ""
    return [
        f"next: dpscope report {runs} --out reports{make}",
        f"      dpscope tensorboard {runs}   (traces in TensorBoard's profiler plugin)",
    ]


def print_summary(record: RunRecord, run_dir: Path, runs_dir: str | Path) -> None:
    """The launcher's closing lines: status, stop reason, warnings, error, what next."""
    print(f"\nrun folder: {run_dir}  status: {record.status}")
    if record.stop_reason:
        print(f"  {record.stop_reason}")
    for warning in record.warnings or []:
        print(f"  warning: {warning}")
    if record.status == "failed" and record.error:
        print(f"  error ({record.error.kind}): {record.error.message}")
    elif record.status == "interrupted" and record.error:
        print(f"  {record.error.message}")
    print("\n" + "\n".join(next_lines(runs_dir)))
