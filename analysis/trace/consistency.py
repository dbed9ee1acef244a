"""Whether a run folder's traces belong to its run.json (docs §1, "Consistency"): each mismatch is
one warning naming both sources, never silent and never fatal.

- run.json `config.world_size` vs the traces' `distributedInfo.world_size`, and vs the ranks that
  have a trace (a missing rank's trace, a rank beyond the world size);
- run.json `traces` (the files this run wrote) vs the files in traces/ (a trace copied in from
  another run, or one the record lists that is gone);
- a trace that is a symbolic link resolving outside the run folder (another run's trace).

A trace that run.json `traces_left_out` names is no stranger: its writer left it out of the run
on purpose (a process of a `--script` run that never joined the process group trained alone).
It is not analysed, and its one line gives the writer's reason.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["run_trace_warnings"]


def _rel(path: str | Path, run_dir: Path) -> str:
    try:
        return Path(path).relative_to(run_dir).as_posix()
    except ValueError:
        return str(path)


def _world_warnings(run_json: Path, world_size: int | None, trace: dict) -> list[str]:
    """run.json's world size vs distributedInfo's and vs the ranks with a trace."""
    out = []
    ranks = sorted(r["rank"] for r in trace["ranks"] if r.get("rank") is not None)
    traced = trace.get("world_size")
    if world_size is not None and traced is not None and traced != world_size:
        out.append(
            f"{run_json}: config.world_size {world_size}, but the traces' distributedInfo says"
            f" world_size {traced} — the traces may be from another run; cross-rank and scaling"
            " numbers assume run.json's"
        )
    if world_size is not None and world_size > 1:
        missing = sorted(set(range(world_size)) - set(ranks))
        extra = [r for r in ranks if r >= world_size]
        if missing:
            out.append(
                f"{run_json}: config.world_size {world_size}, but traces/ has no trace for rank(s)"
                f" {', '.join(map(str, missing[:10]))} — cross-rank numbers cover the others only"
            )
        if extra:
            out.append(
                f"{run_json}: config.world_size {world_size}, but traces/ holds rank(s)"
                f" {', '.join(map(str, extra[:10]))} — traces from another run?"
            )
    return out


def run_trace_warnings(
    run_dir: Path,
    *,
    world_size: int | None,
    listed: list[str],
    trace: dict,
    left_out: dict[str, str] | None = None,
) -> list[str]:
    """Warnings for the traces JSON `trace` of `run_dir`/traces against run.json (`world_size`,
    `listed` = its `traces` entries, `left_out` = its `traces_left_out` as {file: reason},
    paths relative to the run folder)."""
    run_dir = Path(run_dir)
    run_json = run_dir / "run.json"
    out = [
        f"{run_dir / name}: left out of this run by its record ({reason or 'no reason given'})"
        " — not analysed"
        for name, reason in (left_out or {}).items()
        if (run_dir / name).is_file()
    ]
    out += _world_warnings(run_json, world_size, trace)
    files = [r["file"] for r in trace["ranks"]] + [s["file"] for s in trace["skipped"]]
    if listed:
        wanted = set(listed)
        for f in files:
            if _rel(f, run_dir) not in wanted:
                out.append(
                    f"{f}: not among {run_json}'s `traces` — a trace from another run? It is"
                    " analysed with this run's"
                )
    real_dir = os.path.realpath(run_dir)
    for f in files:
        if os.path.islink(f):
            target = os.path.realpath(f)
            if os.path.commonpath([real_dir, target]) != real_dir:
                out.append(
                    f"{f}: a symbolic link to {target}, outside this run folder — another run's"
                    " trace? It is analysed with this run's"
                )
    return out
