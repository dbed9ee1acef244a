"""The runs JSON's `family` (analysis.runs.family.family_summary) read back typed, and the rows of
the report's family tables: what ZeRO-1 and FSDP2 save per rank against DDP and at what
throughput, the largest model each fits in the per-rank budget, and each run's collectives split
by the loop phase that issued them (docs/reference/metrics.md §9 and §11a).

The report only renders these rows (analysis.report.family_section) and words the entries
(analysis.report.verdict); nothing here reads a key the writer might not have written.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec.structs import asdict

from analysis.runs.entry import RunEntry
from analysis.runs.groups import WorkloadKey

__all__ = [
    "Capacity",
    "FamilyEntry",
    "FamilyMember",
    "capacity_rows",
    "family_of",
    "family_rows",
    "collective_phase_rows",
]


class FamilyMember(msgspec.Struct, kw_only=True):
    """One strategy's runs of a family entry: model state of the fullest rank (bytes, mean over
    runs), throughput (samples/s), model state per parameter (bytes), fixed buffers (bytes) and,
    for a sharded member, what it saves against DDP (bytes, % of DDP's) and its throughput as %
    of DDP's."""

    strategy: str = ""
    label: str = ""
    run_ids: list[str] = []
    model_state_bytes: float | None = None
    samples_per_s_mean: float | None = None
    bytes_per_param: float | None = None
    bytes_per_param_by_category: dict[str, float | None] = {}
    fixed_bytes: float | None = None
    saved_bytes: float | None = None
    saved_pct: float | None = None
    throughput_vs_ddp_pct: float | None = None


class Capacity(msgspec.Struct, kw_only=True):
    """The largest model (parameters) a strategy fits in the budget: (budget − fixed) ÷ bytes
    per parameter, rounded down."""

    strategy: str = ""
    label: str = ""
    bytes_per_param: float | None = None
    fixed_bytes: float | None = None
    max_params: int | None = None


class FamilyEntry(WorkloadKey, kw_only=True):
    """One workload (the same-workload key), backend and world size with a DDP run and a
    sharded one: DDP, the sharded members, the per-rank budget (bytes) and where it came from,
    and each measured strategy's capacity."""

    backend: str | None = None
    world_size: int | None = None
    parameters: int | None = None
    ddp: FamilyMember = msgspec.field(default_factory=FamilyMember)
    members: list[FamilyMember] = []
    budget_bytes: int | None = None
    budget_source: str | None = None
    capacity: list[Capacity] = []


def family_of(family: list[FamilyEntry], key: tuple, workload_fields: tuple[str, ...]) -> list:
    """The entries of `family` whose same-workload fields (`workload_fields`) equal `key`."""
    return [f for f in family if tuple(getattr(f, k) for k in workload_fields) == key]


def family_rows(family: list[FamilyEntry]) -> list[dict[str, Any]]:
    """One row per member of each family entry, DDP first."""
    rows = []
    for f in family:
        where = {"model": f.model, "backend": f.backend, "world_size": f.world_size}
        for m in [f.ddp, *f.members]:
            rows.append({**where, **asdict(m), "runs": len(m.run_ids)})
    return rows


def capacity_rows(family: list[FamilyEntry]) -> list[dict[str, Any]]:
    """One row per mode of each family entry's capacity."""
    return [
        {"model": f.model, "world_size": f.world_size, **asdict(c),
         "budget_bytes": f.budget_bytes, "budget_source": f.budget_source}  # fmt: skip
        for f in family
        for c in f.capacity
    ]


def collective_phase_rows(runs: list[RunEntry]) -> list[dict[str, Any]]:
    """Per run, collective and loop phase: the traces' `phases` split of each collective
    (analysis.trace.collectives writes `collectives[].phases`)."""
    rows = []
    for run in runs:
        trace = run.trace if isinstance(run.trace, dict) else {}
        for c in trace.get("collectives") or []:
            rows += [
                {"run_id": run.run_id, "name": c["name"], "algorithm": c.get("algorithm"), **p}
                for p in c.get("phases") or []
            ]
    return rows
