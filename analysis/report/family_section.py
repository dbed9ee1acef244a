"""The report's data-parallel family tables: what ZeRO-1 and FSDP2 save per rank against DDP and
at what throughput, the largest model each fits in the per-rank budget, and the collectives split
by the loop phase that issued them (FSDP2's forward and backward all-gathers, its
reduce-scatters).

Renders only the rows analysis.runs.familyview builds from the runs JSON's `family`
(analysis.runs.family) and each run's traces `collectives[].phases` (analysis.trace.collectives);
definitions in docs/reference/metrics.md §9 and §11a.
"""

from __future__ import annotations

from analysis.columns import CAPACITY_COLS, FAMILY_COLS, PHASE_COLLECTIVE_COLS
from analysis.report.tables import Table
from analysis.runs.familyview import capacity_rows, collective_phase_rows, family_rows
from analysis.runs.runsjson import RunsJson

__all__ = ["context"]


def context(doc: RunsJson) -> dict[str, Table]:
    """The three tables (empty when the runs have no family comparison or no phases)."""
    return {
        "family": Table(
            id="family", columns=FAMILY_COLS, rows=family_rows(doc.family), csv="family.csv"
        ),
        "capacity": Table(
            id="capacity", columns=CAPACITY_COLS, rows=capacity_rows(doc.family), csv="capacity.csv"
        ),
        "collective_phases": Table(
            id="collective_phases",
            columns=PHASE_COLLECTIVE_COLS,
            rows=collective_phase_rows(doc.runs),
            csv="collective_phases.csv",
        ),
    }
