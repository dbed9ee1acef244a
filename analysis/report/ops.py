"""Report sections "What DDP adds" and "Operators", from the runs JSON only.

"What DDP adds": the runs JSON's `ddp_adds` (computed by analysis.runs.opdiff.ddp_adds: per group
of DDP runs, DDP rank 0 against the single-device run of the same workload), the 10 largest
per-step deltas of operator self time. "Operators": each run's top operators per rank by self
time per step, one collapsible table per run and rank.
"""

from __future__ import annotations

from typing import Any

from analysis.columns import DDP_ADDS_COLS, OPS_COLS
from analysis.report.tables import Table
from analysis.runs.opdiff import has_ops

__all__ = ["ops_context"]

TOP_DELTAS = 10
TOP_OPS = 15


def _ddp_adds(data: dict[str, Any], labels: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for i, diff in enumerate(data.get("ddp_adds") or []):
        ddp, single = diff["b"]["run_id"], diff["a"]["run_id"]
        out.append(
            {
                "title": f"{labels.get(ddp, ddp)} (rank 0) vs {labels.get(single, single)}",
                "step_time_us": diff["step_time_us"],
                "per_sample": diff["per_sample"],
                "warnings": diff["warnings"],
                "table": Table(
                    id=f"ddp-adds-{i}", columns=DDP_ADDS_COLS, rows=diff["ops"][:TOP_DELTAS]
                ),
            }
        )
    return out


def _operators(data: dict[str, Any], labels: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for i, run in enumerate(r for r in data.get("runs", []) if has_ops(r)):
        for rank in run["trace"]["ranks"]:
            out.append(
                {
                    "title": f"{labels.get(run['run_id'], run['run_id'])} · rank {rank['rank']}",
                    "step_time_us": rank.get("step_time_us_mean"),
                    "timelines": rank.get("ops_self_us_per_step") or {},
                    "table": Table(
                        id=f"ops-{i}-{rank['rank']}",
                        columns=OPS_COLS,
                        rows=(rank.get("ops") or [])[:TOP_OPS],
                    ),
                }
            )
    return out


def ops_context(data: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """Template context for the two sections (empty lists when no run has op data); `labels` are
    the report's one label per run."""
    return {"ddp_adds": _ddp_adds(data, labels), "operators": _operators(data, labels)}
