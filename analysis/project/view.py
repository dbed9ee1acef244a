"""The runs JSON's `comm`, `projections` and `projection_skipped` read typed (analysis/project/runs.py
writes them), and what the report's Projection section and the verdict show of them, decided
here: which predictions are complete, the prediction a finding quotes, where efficiency first
drops below half and why, and how each replay and measured run compares with its band.

Only the fields something shows are declared; the rest of each entry is in the runs JSON.
Every number is defined in docs/reference/metrics.md §10.
"""

from __future__ import annotations

import math

import msgspec

from analysis.project.runs import FINDING_RANKS

__all__ = [
    "FINDING_RANKS",
    "LOW_EFFICIENCY",
    "REPLAY_GOAL_PCT",
    "SELF_REPLAY_GOAL_PCT",
    "Check",
    "CheckCase",
    "CommEntry",
    "Prediction",
    "ProjectionCase",
    "ProjectionEntry",
    "SkippedInput",
    "complete",
    "prediction_at",
    "projection_case",
]

LOW_EFFICIENCY = 0.5  # below this projected efficiency more ranks stop paying
EXPOSED_WARN_PCT = 25.0  # a projected exposed share above this is a warning
REPLAY_GOAL_PCT = 10.0  # the target for replay and measured errors
SELF_REPLAY_GOAL_PCT = 2.0  # the self-replay (own traced comm) checks the arithmetic alone


class BandSource(msgspec.Struct, kw_only=True):
    """One measured input behind a band and where its spread comes from."""

    term: str = ""
    source: str = ""


class Prediction(msgspec.Struct, kw_only=True):
    """One projected world size (s per step, samples/s, ×, efficiency as a ratio), band included."""

    ranks: int = 0
    per_device_batch: float | None = None
    step_time_s: float | None = None
    step_time_s_low: float | None = None
    step_time_s_high: float | None = None
    compute_s: float | None = None
    straggler_s: float | None = None
    comm_s: float | None = None
    exposed_comm_s: float | None = None
    exposed_comm_pct: float | None = None  # % of the step
    buffer_broadcast_s: float | None = None
    samples_per_s: float | None = None
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    scaling_efficiency: float | None = None
    scaling_efficiency_low: float | None = None
    scaling_efficiency_high: float | None = None
    band_sources: list[BandSource] = []


class TracedCheck(msgspec.Struct, kw_only=True):
    """The self-replay of a DDP run from its own traced per-bucket comm (s per step)."""

    predicted_step_time_s: float | None = None
    measured_step_time_s: float | None = None
    error_pct: float | None = None


class Check(msgspec.Struct, kw_only=True):
    """A replay or a measured run: projected (with its band) vs measured, s per step."""

    run_id: str = ""
    ranks: int | None = None
    measured_step_time_s: float | None = None
    predicted_step_time_s: float | None = None
    predicted_step_time_s_low: float | None = None
    predicted_step_time_s_high: float | None = None
    in_band: bool | None = None
    error_pct: float | None = None
    measured_scaling_efficiency: float | None = None
    traced: TracedCheck | None = None  # replays only


class ProjectionInputs(msgspec.Struct, kw_only=True):
    gpus_per_node: int | None = None
    inter_node_gbps: float | None = None


class ProjectionEntry(msgspec.Struct, kw_only=True):
    """One projection of the runs JSON (`projections[]`)."""

    run_id: str = ""
    comm_run_id: str = ""
    backend: str | None = None
    scaling: str | None = None
    inputs: ProjectionInputs = msgspec.field(default_factory=ProjectionInputs)
    assumptions: list[str] = []
    measured: list[Check] = []
    replays: list[Check] = []
    predictions: list[Prediction] = []
    fp16_exposed_comm_pct: float | None = None
    warnings: list[str] = []


class CommSkip(msgspec.Struct, kw_only=True):
    collective: str = ""
    reason: str = ""


class CommEntry(msgspec.Struct, kw_only=True):
    """One comm benchmark of the runs JSON (`comm[]`): its rows (bytes, busbw_gbps, collective,
    ...) are drawn as they are."""

    run_id: str = ""
    status: str | None = None
    backend: str | None = None
    world_size: int | None = None
    gap_ms: dict[str, float | None] = {}  # collective -> compute before each call (ms)
    rows: list[dict[str, object]] = []
    skipped: list[CommSkip] = []


class SkippedInput(msgspec.Struct, kw_only=True):
    """A folder the runs JSON could not use (`skipped[]`, `projection_skipped[]`)."""

    path: str = ""
    reason: str = ""


def _number(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


_BANDED = ("step_time_s", "speedup", "scaling_efficiency")
_SHOWN = ("exposed_comm_pct", "exposed_comm_s", "straggler_s", "compute_s", "comm_s")


def complete(x: Prediction) -> bool:
    """True when a prediction has every number the report shows (finite, with its band)."""
    keys = [*_BANDED, *(f"{k}_{e}" for k in _BANDED for e in ("low", "high")), *_SHOWN]
    return all(_number(getattr(x, k)) for k in keys)


def prediction_at(p: ProjectionEntry, ranks: int) -> Prediction | None:
    """The complete prediction of `p` at `ranks`, if any."""
    return next((x for x in p.predictions if complete(x) and x.ranks == ranks), None)


class CheckCase(msgspec.Struct, kw_only=True):
    """One replay (`replay`) or measured run (`measured`) of a projection, judged against
    REPLAY_GOAL_PCT; `traced_bad` judges its self-replay against SELF_REPLAY_GOAL_PCT (None
    without one)."""

    kind: str
    check: Check
    bad: bool
    traced_bad: bool | None = None


class ProjectionCase(msgspec.Struct, kw_only=True):
    """What the Projection section says of one projection: its complete predictions, the one at
    FINDING_RANKS (`at`; `warn` when its exposed share is over EXPOSED_WARN_PCT; `broadcasts`
    when it carries DDP's buffer broadcasts), the first below LOW_EFFICIENCY (`low`;
    `straggler_first` when waiting for the slowest rank costs more there than exposed comm)
    and its checks."""

    entry: ProjectionEntry
    predictions: list[Prediction]
    at: Prediction | None = None
    warn: bool = False
    broadcasts: bool = False
    low: Prediction | None = None
    straggler_first: bool = False
    checks: list[CheckCase] = []


def _checks(p: ProjectionEntry) -> list[CheckCase]:
    keys = ("error_pct", "predicted_step_time_s", "measured_step_time_s",
            "predicted_step_time_s_low", "predicted_step_time_s_high")  # fmt: skip
    out = []
    for kind, checks in (("replay", p.replays), ("measured", p.measured)):
        for c in checks:
            if not all(_number(getattr(c, k)) for k in keys):
                continue
            t = c.traced if kind == "replay" and c.traced and _number(c.traced.error_pct) else None
            out.append(CheckCase(
                kind=kind, check=c, bad=abs(c.error_pct or 0.0) > REPLAY_GOAL_PCT,
                traced_bad=None if t is None else abs(t.error_pct or 0.0) > SELF_REPLAY_GOAL_PCT,
            ))  # fmt: skip
    return out


def projection_case(p: ProjectionEntry) -> ProjectionCase:
    """The ProjectionCase of one projection."""
    preds = [x for x in p.predictions if complete(x)]
    at = next((x for x in preds if x.ranks == FINDING_RANKS), None)
    low = next((x for x in preds if (x.scaling_efficiency or 0.0) < LOW_EFFICIENCY), None)
    return ProjectionCase(
        entry=p,
        predictions=preds,
        at=at,
        warn=at is not None and (at.exposed_comm_pct or 0.0) > EXPOSED_WARN_PCT,
        broadcasts=bool(at and at.buffer_broadcast_s),
        low=low,
        straggler_first=low is not None and (low.straggler_s or 0.0) > (low.exposed_comm_s or 0.0),
        checks=_checks(p),
    )
