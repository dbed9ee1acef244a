"""Baselines and noise (docs/reference/metrics.md §7): run folders written by the `--script`
assembler (profiler.runfolder.parts) from hand-made rank parts whose step times are known, so every
expected number is arithmetic on those times; in-process, no training."""

from __future__ import annotations

import statistics
from pathlib import Path

import msgspec
import pytest

from analysis.columns import CLI_RUN_COLS, SUMMARY_COLS, fmt
from analysis.report.tables import summary_rows
from analysis.runs.compare import compare_runs
from profiler.runfolder.parts import assemble
from profiler.runfolder.schema import ProfileSettings, RankPart, StepRow
from profiler.runfolder.stepmetrics import step_metrics

SAMPLES = 32  # per rank and step
PROFILE = ProfileSettings(enabled=True, wait=1, warmup=1, active=3, repeat=1)


def _rows(rank: int, step_s: list[float], profiled: set[int]) -> list[StepRow]:
    return [
        StepRow(rank=rank, epoch=0, step=step, warmup=int(step < 2), step_time_s=t,
                profiled=int(step in profiled), profiler_s=0.0, data_s=0.1 * t,
                forward_s=0.3 * t, backward_s=0.4 * t, optimizer_s=0.1 * t, samples=SAMPLES)
        for step, t in enumerate(step_s)
    ]  # fmt: skip


def rank_part(rank: int, world: int, step_s: list[float], *, active=(), profiled=()) -> RankPart:
    ddp = world > 1
    return msgspec.convert(
        {
            "rank": rank,
            "world_size": world,
            "env_world_size": world,
            "pg_seen": ddp,
            "mode": "ddp" if ddp else "single",
            "backend": "gloo" if ddp else "none",
            "devices": ["cpu"],
            "model": "Net",
            "param_count": 10,
            "workload": None,
            "rows": _rows(rank, step_s, set(profiled)),
            "micro_batches": [1] * len(step_s),
            "active_steps": list(active),
            "memory": [],
            "memory_after_first_step": [],
            "memory_breakdown": [],
            "traces": [],
            "warnings": [],
            "wall_time_s": 1.0,
            "env": {"os": "Linux", "host_load": None},
            "ended": "ok",
            "exit_code": 0,
        },
        RankPart,
    )  # fmt: skip  (as read_parts decodes a part file)


def _run(runs: Path, run_id: str, samples_per_s: float, *, world: int = 1, seed=None) -> Path:
    """A script run whose every rank's measured steps give `samples_per_s` in total."""
    step_s = world * SAMPLES / samples_per_s
    parts = [rank_part(r, world, [step_s] * 8) for r in range(world)]
    extra = {"script": "/home/me/train.py", "script_args": ["--lr", "0.1"], "seed": seed,
             "workload": "script:0123456789abcdef --lr 0.1"}  # fmt: skip
    (runs / run_id / "logs").mkdir(parents=True)
    assemble(runs / run_id, parts, run_id=run_id, status="ok", profile=PROFILE,
             warmup_steps=2, config_extra=extra)  # fmt: skip
    return runs / run_id


def test_seedless_runs_pair_against_the_mean_of_their_single_runs(tmp_path):
    """The issue's case: three single runs of one script at 100, 355 and 472 samples/s and one
    DDP run at 2360. Against the first single run the DDP speedup would be 23.6× and the other
    singles 3.55× and 4.72×; against the group mean it is 2360 ÷ 309 = 7.64×, and every single
    run is 1× by definition, its spread the noise."""
    singles = {"s-a": 100.0, "s-b": 355.0, "s-c": 472.0}
    for rid, rate in singles.items():
        _run(tmp_path, rid, rate)
    _run(tmp_path, "ddp", 2360.0, world=2)
    result = compare_runs([tmp_path], progress=False, traces=False)
    runs = {r["run_id"]: r for r in result["runs"]}
    mean = statistics.fmean(singles.values())
    noise = 100 * (472.0 - 100.0) / mean
    for rid in singles:
        single = runs[rid]
        assert single["samples_per_s"] == pytest.approx(singles[rid])
        assert (single["speedup"], single["scaling_efficiency"]) == (1.0, 1.0)
        assert single["baseline_kind"] == "self" and single["baseline_run_id"] == rid
        assert single["baseline_noise_pct"] == pytest.approx(noise)
    ddp = runs["ddp"]
    assert ddp["baseline_kind"] == "group_mean" and sorted(ddp["baseline_run_ids"]) == sorted(
        singles
    )
    assert ddp["baseline_samples_per_s"] == pytest.approx(mean)
    assert ddp["speedup"] == pytest.approx(2360.0 / mean) == pytest.approx(7.638, abs=1e-3)
    assert ddp["scaling_efficiency"] == pytest.approx(2360.0 / mean / 2)
    assert ddp["baseline_run_id"] == "s-b"  # the single run nearest the mean: memory, ops
    assert ddp["baseline_noise_pct"] == pytest.approx(noise)
    (single_group,) = [g for g in result["groups"] if g["mode"] == "single"]
    assert (single_group["speedup_mean"], single_group["speedup_std"]) == (1.0, 0.0)
    # The runs table shows the noise next to the speedups, captioned by the script.
    assert ddp["workload_label"] == "train.py --lr 0.1"
    assert "Noise" in [c.label for c in SUMMARY_COLS]


def test_same_seed_pairing_stays_where_seeds_exist(tmp_path):
    _run(tmp_path, "single-s0", 100.0, seed=0)
    _run(tmp_path, "single-s1", 200.0, seed=1)
    _run(tmp_path, "ddp-s1", 300.0, world=2, seed=1)
    _run(tmp_path, "ddp-s7", 300.0, world=2, seed=7)  # no single run with seed 7: the mean
    runs = {r["run_id"]: r for r in compare_runs([tmp_path], progress=False, traces=False)["runs"]}
    assert runs["ddp-s1"]["baseline_kind"] == "same_seed"
    assert runs["ddp-s1"]["baseline_run_id"] == "single-s1"
    assert runs["ddp-s1"]["speedup"] == pytest.approx(1.5)
    assert runs["ddp-s7"]["baseline_kind"] == "group_mean"
    assert runs["ddp-s7"]["speedup"] == pytest.approx(2.0)
    assert runs["single-s1"]["speedup"] == 1.0


def _overhead_rows(traced_s: float) -> list[dict]:
    """Steps 0-1 warm-up, 2-4 traced (active), 5-11 unprofiled at 1.0, 1.1, 0.9, ... s."""
    clean = [1.0, 1.1, 0.9, 1.0, 1.1, 0.9, 1.0]
    return _rows(0, [1.0, 1.0, traced_s, traced_s, traced_s, *clean], {1, 2, 3, 4})


@pytest.mark.parametrize(
    ("traced_s", "within"),
    [(0.5, True), (0.98, True), (1.02, True), (1.5, False)],
)
def test_profiler_overhead_below_zero_or_within_noise_is_never_a_cost(tmp_path, traced_s, within):
    """Two standard errors of the difference of the means: 200 × √(s_t²/k + s_c²/m) ÷ mean_c,
    the traced steps borrowing the clean ones' spread when they have none of their own."""
    rows = _overhead_rows(traced_s)
    metrics, _ = step_metrics(rows, {(0, 2), (0, 3), (0, 4)})
    clean = [1.0, 1.1, 0.9, 1.0, 1.1, 0.9, 1.0]
    s_c, mean_c = statistics.stdev(clean), statistics.fmean(clean)
    noise = 200 * (0.0 / 3 + s_c**2 / 7) ** 0.5 / mean_c  # identical traced steps: s_t = 0
    assert metrics.profiler_overhead_pct == pytest.approx((traced_s / mean_c - 1) * 100)
    assert metrics.profiler_overhead_noise_pct == pytest.approx(noise)
    part = msgspec.structs.replace(rank_part(0, 1, [1.0] * 12), rows=rows, active_steps=[2, 3, 4])
    (tmp_path / "r" / "logs").mkdir(parents=True)
    assemble(tmp_path / "r", [part], run_id="r", status="ok", profile=PROFILE, warmup_steps=2)
    data = compare_runs([tmp_path / "r"], progress=False, traces=False)
    (run,) = data["runs"]
    assert run["profiler_overhead_within_noise"] is within
    col = next(c for c in CLI_RUN_COLS if c.key == "profiler_overhead_pct")
    (row,) = summary_rows(data, {})
    shown = fmt(row["profiler_overhead_pct"], col, row)
    if within:
        assert shown == f"within noise (±{noise:.1f}%)" and "-" not in shown
    else:
        assert shown == f"{(1.5 / mean_c - 1) * 100:.1f}"


def test_the_export_is_left_out_of_the_overhead():
    """A traced step's own time is its step time less `profiler_s` (the trace export at the end
    of the window, which the trace does not show)."""
    rows = _overhead_rows(1.0)
    rows[4].step_time_s += 0.8
    rows[4].profiler_s = 0.8
    metrics, _ = step_metrics(rows, {(0, 2), (0, 3), (0, 4)})
    assert metrics.profiler_overhead_pct == pytest.approx(0.0, abs=1e-9)
