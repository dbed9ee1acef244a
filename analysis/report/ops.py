"""Report sections "What DDP adds" and "Operators", from the runs JSON only.

"What DDP adds": per group of DDP runs, DDP rank 0 against the single-device run of the same
workload (the run's `baseline_run_id`, same seed where there is one), the 10 largest per-step
deltas of operator self time (analysis/runs/opdiff.py `diff_entries`). "Operators": each run's top
operators per rank by self time per step, one collapsible table per run and rank.
"""

from __future__ import annotations

from typing import Any

from analysis.columns import DDP_ADDS_COLS, OPS_COLS
from analysis.report.tables import Table
from analysis.runs.opdiff import diff_entries

__all__ = ["ops_context"]

TOP_DELTAS = 10
TOP_OPS = 15


def _traced(run: dict[str, Any]) -> bool:
    trace = run.get("trace") or {}
    return run.get("status") == "ok" and any(r.get("ops") for r in trace.get("ranks") or [])


def _ddp_adds(data: dict[str, Any], labels: dict[str, str]) -> list[dict[str, Any]]:
    runs = {r["run_id"]: r for r in data.get("runs", [])}
    out = []
    for i, group in enumerate(g for g in data.get("groups", []) if g.get("mode") == "ddp"):
        pairs = [
            (runs[rid], runs.get(runs[rid].get("baseline_run_id")))
            for rid in group.get("run_ids", [])
            if rid in runs
        ]
        pairs = [(d, s) for d, s in pairs if s and _traced(d) and _traced(s)]
        if not pairs:
            continue
        ddp, single = pairs[0]
        diff = diff_entries(single, ddp, rank=0)
        out.append(
            {
                "title": f"{labels.get(ddp['run_id'], ddp['run_id'])} (rank 0) vs "
                f"{labels.get(single['run_id'], single['run_id'])}",
                "step_time_us": diff["step_time_us"],
                "per_sample": diff["per_sample"],
                "warnings": diff["warnings"],
                "table": Table(
                    id=f"ddp-adds-{i}",
                    columns=DDP_ADDS_COLS,
                    rows=diff["ops"][:TOP_DELTAS],
                ),
            }
        )
    return out


def _operators(data: dict[str, Any], labels: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for i, run in enumerate(r for r in data.get("runs", []) if _traced(r)):
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
