"""Report sections "What DDP adds" and "Operators", from the typed runs JSON.

"What DDP adds": the runs JSON's `ddp_adds` (computed by analysis.runs.opdiff.ddp_adds: per group
of DDP runs, DDP rank 0 against the single-device run of the same workload), the 10 largest
per-step deltas of operator self time. "Operators": each run's top operators per rank by self
time per step (analysis.runs.rows.rank_ops), one collapsible table per run and rank.
"""

from __future__ import annotations

from typing import Any

from analysis.columns import DDP_ADDS_COLS, OPS_COLS
from analysis.report.labels import Labels
from analysis.report.tables import Table
from analysis.runs.rows import rank_ops
from analysis.runs.runsjson import RunsJson

__all__ = ["ops_context"]

TOP_DELTAS = 10
TOP_OPS = 15


def _ddp_adds(doc: RunsJson, labels: Labels) -> list[dict[str, Any]]:
    return [
        {
            "title": f"{labels[diff.b.run_id]} (rank 0) vs {labels[diff.a.run_id]}",
            "step_time_us": diff.step_time_us,
            "per_sample": diff.per_sample,
            "warnings": diff.warnings,
            "table": Table(id=f"ddp-adds-{i}", columns=DDP_ADDS_COLS, rows=diff.ops[:TOP_DELTAS]),
        }
        for i, diff in enumerate(doc.ddp_adds)
    ]


def _operators(doc: RunsJson, labels: Labels) -> list[dict[str, Any]]:
    return [
        {
            "title": f"{labels[rank.run_id]} · rank {rank.rank}",
            "ops": rank,
            "table": Table(id=f"ops-{i}-{rank.rank}", columns=OPS_COLS, rows=rank.ops),
        }
        for i, ranks in enumerate(rank_ops(doc, TOP_OPS))
        for rank in ranks
    ]


def ops_context(doc: RunsJson, labels: dict[str, str]) -> dict[str, Any]:
    """Template context for the two sections (empty lists when no run has op data); `labels` are
    the report's one label per run."""
    labels = Labels(labels)
    return {"ddp_adds": _ddp_adds(doc, labels), "operators": _operators(doc, labels)}
