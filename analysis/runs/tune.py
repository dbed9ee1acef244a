"""Tune folders (`runs/tune-<id>/tune.json`, written by `make tune-ddp`) in the runs JSON.

A tune folder is recognised by its `tune.json`, wherever `find_run_dirs` would look for run
folders. Its trial run folders are deliberately kept out of the main comparison (one tune is
dozens of near-identical runs); the report's "DDP tuning" section summarises them instead. The
numbers are the tuner's own (workloads.tools.tune_stats, docs/reference/metrics.md §8); this module only reads
and type-checks them, so a damaged tune.json costs one `skipped` line, never the report.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from profiler.runfolder.errors import InputError
from profiler.runfolder.inputfile import decode_json

__all__ = [
    "TUNE_FILE",
    "TuneArm",
    "TuneEntry",
    "find_tune_dirs",
    "is_tune_dir",
    "load_tune",
    "load_tunes",
]

TUNE_FILE = "tune.json"
_NUM = (
    "samples_per_s_median",
    "samples_per_s_min",
    "samples_per_s_max",
    "spread_pct",
    "speedup_vs_baseline",
    "speedup_min",
    "speedup_max",
    "p_value",
    "loss_max_abs_diff",
)
_TEXT = ("name", "status", "reason", "note", "stage", "group")


def is_tune_dir(path: Path) -> bool:
    """True when `path` holds a tune.json."""
    return os.path.lexists(Path(path) / TUNE_FILE)  # a FIFO there gets its skipped line


def find_tune_dirs(paths: Sequence[Path]) -> list[Path]:
    """Tune folders among `paths` and their children (the same places run folders are sought)."""
    found: list[Path] = []
    for path in map(Path, paths):
        if is_tune_dir(path):
            found.append(path)
        elif path.is_dir():
            found += sorted(p for p in path.iterdir() if p.is_dir() and is_tune_dir(p))
    return found


def _num(v: Any) -> float | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _text(v: Any) -> str | None:
    return None if v is None else str(v)


class TuneArm(msgspec.Struct, kw_only=True):
    """One arm of a tune (its baseline or a candidate) with only the expected fields, each of the
    expected type (else empty): the tuner's numbers (docs/reference/metrics.md §8), its trials
    counted, and its flags."""

    samples_per_s_median: float | None = None  # samples/s
    samples_per_s_min: float | None = None
    samples_per_s_max: float | None = None
    spread_pct: float | None = None  # (max − min) ÷ median × 100
    speedup_vs_baseline: float | None = None  # ×
    speedup_min: float | None = None
    speedup_max: float | None = None
    p_value: float | None = None  # exact two-sided Mann–Whitney
    loss_max_abs_diff: float | None = None  # nats
    name: str | None = None
    status: str | None = None
    reason: str | None = None
    note: str | None = None
    stage: str | None = None
    group: str | None = None
    samples_per_s_runs: list[float] = []
    args: list[str] = []
    trials: int = 0
    trials_ok: int = 0
    significant: bool = False
    loss_flagged: bool = False
    lossy: bool = False


class TuneEntry(msgspec.Struct, kw_only=True):
    """One tune folder in the runs JSON (`tunes[]`), in its field order."""

    tune_id: str = ""
    path: str = ""
    status: str | None = None
    workload: dict[str, Any] = {}  # str, number or list values of tune.json `workload`
    rules: dict[str, Any] = {}  # str or number values of tune.json `rules`
    baseline: TuneArm = msgspec.field(default_factory=TuneArm)
    candidates: list[TuneArm] = []
    best: TuneArm | None = None
    command: str | None = None
    launcher_command: str | None = None
    stopped_early: bool = False
    stop_reason: str | None = None
    elapsed_s: float | None = None


def _arm(raw: Any) -> TuneArm:
    """One arm with only the expected fields, each of the expected type (else None)."""
    raw = raw if isinstance(raw, dict) else {}
    runs = raw.get("samples_per_s_runs")
    args = raw.get("args")
    trials = raw.get("trials") if isinstance(raw.get("trials"), list) else []
    return TuneArm(
        **{k: _num(raw.get(k)) for k in _NUM},
        **{k: _text(raw.get(k)) for k in _TEXT},
        samples_per_s_runs=(
            [x for x in map(_num, runs) if x is not None] if isinstance(runs, list) else []
        ),
        args=[str(a) for a in args] if isinstance(args, list) else [],
        trials=len(trials),
        trials_ok=sum(1 for t in trials if isinstance(t, dict) and t.get("status") == "ok"),
        significant=raw.get("significant") is True,
        loss_flagged=raw.get("loss_flagged") is True,
        lossy=raw.get("lossy") is True,
    )


def load_tune(tune_dir: Path) -> TuneEntry:
    """The runs-JSON entry of one tune folder; raises ValueError (one line) when unreadable."""
    path = Path(tune_dir) / TUNE_FILE
    try:  # the reading rules of every record (profiler.runfolder.inputfile): regular file, size, depth
        raw = decode_json(path, "tune.json", "re-run `make tune-ddp`")
    except InputError as err:
        raise ValueError(f"{err.what} — {err.fix}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("candidates"), list):
        raise ValueError("has no `candidates` list — not written by `make tune-ddp`")
    workload = raw.get("workload")
    if not isinstance(workload, dict) or not isinstance(workload.get("model"), str):
        raise ValueError("has no string `workload.model` — not written by `make tune-ddp`")
    best = raw.get("best") if isinstance(raw.get("best"), dict) else None
    rules = raw.get("rules") if isinstance(raw.get("rules"), dict) else {}
    return TuneEntry(
        tune_id=_text(raw.get("tune_id")) or Path(tune_dir).name,
        path=str(tune_dir),
        status=_text(raw.get("status")),
        workload={k: v for k, v in workload.items() if isinstance(v, str | int | float | list)},
        rules={k: v for k, v in rules.items() if isinstance(v, str | int | float)},
        baseline=_arm(raw.get("baseline")),
        candidates=[_arm(c) for c in raw["candidates"]],
        best=_arm(best) if best else None,
        command=_text(raw.get("command")),
        launcher_command=_text(raw.get("launcher_command")),
        stopped_early=raw.get("stopped_early") is True,
        stop_reason=_text(raw.get("stop_reason")),
        elapsed_s=_num(raw.get("elapsed_s")),
    )


def load_tunes(paths: Sequence[Path]) -> tuple[list[TuneEntry], list[dict]]:
    """(tune entries, skipped) for the tune folders under `paths`; skipped lists {path, reason}."""
    tunes, skipped = [], []
    for tune_dir in find_tune_dirs(paths):
        try:
            tunes.append(load_tune(tune_dir))
        except ValueError as err:
            skipped.append({"path": str(tune_dir / TUNE_FILE), "reason": str(err)})
    return tunes, skipped
