"""The report's data-parallel family tables: what ZeRO-1 and FSDP2 save per rank against DDP and
at what throughput, the largest model each fits in the per-rank budget, and the collectives split
by the loop phase that issued them (FSDP2's forward and backward all-gathers, its
reduce-scatters).

Renders only what the runs JSON holds: `family` (analysis.runs.family) and each run's traces
`collectives[].phases` (analysis.trace.collectives); definitions in docs/reference/metrics.md
§9 and §11a.
"""

from __future__ import annotations

from typing import Any

from analysis.family_columns import CAPACITY_COLS, FAMILY_COLS, PHASE_COLLECTIVE_COLS
from analysis.report.tables import Table

__all__ = ["capacity_rows", "context", "family_rows", "phase_rows"]


def family_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per member of each family entry, DDP first."""
    rows = []
    for f in data.get("family") or []:
        where = {k: f.get(k) for k in ("model", "backend", "world_size")}
        for m in [f["ddp"], *f.get("members", [])]:
            rows.append({**where, **m, "runs": len(m.get("run_ids") or [])})
    return rows


def capacity_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per mode of each family entry's capacity."""
    rows = []
    for f in data.get("family") or []:
        for c in f.get("capacity") or []:
            rows.append(
                {
                    "model": f.get("model"),
                    "world_size": f.get("world_size"),
                    **c,
                    "budget_bytes": f.get("budget_bytes"),
                    "budget_source": f.get("budget_source"),
                }
            )
    return rows


def phase_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per run, collective and loop phase: the traces' `phases` split of each collective."""
    rows = []
    for run in data.get("runs") or []:
        for c in (run.get("trace") or {}).get("collectives") or []:
            rows += [
                {"run_id": run["run_id"], "name": c["name"], "algorithm": c.get("algorithm"), **p}
                for p in c.get("phases") or []
            ]
    return rows


def context(data: dict[str, Any]) -> dict[str, Table]:
    """The three tables (empty when the runs have no family comparison or no phases)."""
    return {
        "family": Table(id="family", columns=FAMILY_COLS, rows=family_rows(data), csv="family.csv"),
        "capacity": Table(
            id="capacity", columns=CAPACITY_COLS, rows=capacity_rows(data), csv="capacity.csv"
        ),
        "collective_phases": Table(
            id="collective_phases",
            columns=PHASE_COLLECTIVE_COLS,
            rows=phase_rows(data),
            csv="collective_phases.csv",
        ),
    }
