"""Report sections "What DDP adds" and "Operators", from the runs JSON only.

"What DDP adds": per group of DDP runs, DDP rank 0 against the single-device run of the same
workload (the run's `baseline_run_id`, same seed where there is one), the 10 largest per-step
deltas of operator self time (analysis/runs/opdiff.py `diff_entries`). "Operators": each run's top
operators per rank by self time per step, one collapsible table per run and rank.
"""

from __future__ import annotations

from typing import Any

from analysis.columns import C
from analysis.report.tables import Table
from analysis.runs.opdiff import diff_entries

__all__ = ["ops_context"]

TOP_DELTAS = 10
TOP_OPS = 15


def diff_columns(a: str, b: str, *, digits: int, wrap: bool = False) -> list[C]:
    """Columns of an operator diff (`analysis diff`, "What DDP adds"), sides named `a` and `b`."""
    return [
        C(key="name", label="Operator", wrap=wrap),
        C(key="kind", label="Kind"),
        C(key="status", label="Status"),
        C(key="calls_per_step_a", label=f"Calls{a}", unit="per step", kind="num", digits=1),
        C(key="calls_per_step_b", label=f"Calls{b}", unit="per step", kind="num", digits=1),
        C(key="self_us_per_step_a", label=f"Self{a}", unit="µs/step", kind="num", digits=digits),
        C(key="self_us_per_step_b", label=f"Self{b}", unit="µs/step", kind="num", digits=digits),
        C(key="delta_us_per_step", label="Δ self", unit="µs/step", kind="num", digits=digits),
        C(key="delta_pct", label="Δ self", unit="%", kind="num", digits=1),
        C(key="delta_us_per_sample", label="Δ self", unit="µs/sample", kind="num", digits=2),
    ]


DIFF_COLS = diff_columns(", single", ", DDP", digits=0, wrap=True)
OPS_COLS = [
    C(key="name", label="Operator", wrap=True),
    C(key="kind", label="Kind"),
    C(key="calls_per_step", label="Calls", unit="per step", kind="num", digits=1),
    C(key="self_us_per_step", label="Self", unit="µs/step", kind="num", digits=0),
    C(key="total_us_per_step", label="Total", unit="µs/step", kind="num", digits=0),
    C(key="pct_of_step", label="Self", unit="% of step", kind="num", digits=1),
]


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
                    columns=DIFF_COLS,
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
