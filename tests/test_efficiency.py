"""Issue 27: the efficiency-loss split. A hand-built pair of runs where every part is known by
construction (single 1 s/step; 2-rank DDP 0.625 s/step = 0.5 s ideal + 0.125 s of known losses),
and real runs where the parts must sum exactly to the measured loss."""

from __future__ import annotations

import math

import msgspec
import pytest

from analysis.runs.compare import WORKLOAD_KEY, compare_runs
from analysis.runs.efficiency import PARTS, attach_efficiency_loss, efficiency_loss_pts
from analysis.runs.entry import RunEntry
from analysis.runs.groups import GroupEntry

WORKLOAD = {"model": "m", "dataset": "d", "scaling": "strong", "fixed_batch": 64, "amp": "none",
            "device_type": "cpu", "os": "Linux"}  # fmt: skip


def hand_run(run_id: str, mode: str, world: int, sps: float, phases: dict, **extra) -> RunEntry:
    # Every field the split does not read left empty: the entry as load_run would leave it.
    blank = {f.name: None for f in msgspec.structs.fields(RunEntry) if f.required}
    return RunEntry(**{**blank, "run_id": run_id, "status": "ok", "mode": mode,
                       "world_size": world, "seed": 0, "global_batch": 64, "samples_per_s": sps,
                       "phases_per_rank_s": [{"rank": 0, **phases}], "exposed_comm_pct": None,
                       "trace": None, **WORKLOAD, **extra})  # fmt: skip


def _key(run: RunEntry) -> tuple:
    return tuple(getattr(run, k) for k in WORKLOAD_KEY)


def hand_built() -> tuple[RunEntry, RunEntry, RunEntry]:
    # Single: 1 s per step of 64 samples; data 0.1, forward 0.3, backward 0.5, optimizer 0.1.
    single = hand_run(
        "single",
        "single",
        1,
        64.0,
        {"data": 0.1, "forward": 0.3, "backward": 0.5, "optimizer": 0.1, "step_time": 1.0},
    )
    # 1-rank DDP: the same step plus DDP's own 25 ms (reducer, bucket copies).
    ddp1 = hand_run(
        "ddp1",
        "ddp",
        1,
        64 / 1.025,
        {"data": 0.1, "forward": 0.3, "backward": 0.525, "optimizer": 0.1, "step_time": 1.025},
    )
    # 2-rank DDP, 0.625 s = the ideal 0.5 s (half of every phase) plus, by construction:
    # 50 ms exposed comm (12.5 ms of it sync wait), 12.5 ms extra data wait, 25 ms DDP overhead
    # (in backward), 25 ms contention (in forward) and 12.5 ms outside the phases (residual).
    ddp2 = hand_run(
        "ddp2",
        "ddp",
        2,
        64 / 0.625,
        {
            "data": 0.0625,
            "forward": 0.175,
            "backward": 0.25 + 0.025 + 0.05,
            "optimizer": 0.05,
            "step_time": 0.625,
        },
        exposed_comm_pct=8.0,  # 50 ms of a 625 ms traced step
        trace={
            "ranks": [{"steps": 2, "step_time_us_mean": 625_000.0}],
            "collectives": [{"sync_us_total": 25_000.0}],
        },
    )  # 12.5 ms per step
    # fmt: skip
    for run in (single, ddp1, ddp2):
        run.scaling_efficiency = run.samples_per_s / 64.0 / run.world_size
        run.baseline_run_id = "single"
    return single, ddp1, ddp2


def test_hand_built_split_recovers_every_known_part():
    single, ddp1, ddp2 = hand_built()
    assert ddp2.scaling_efficiency == pytest.approx(0.8)
    parts = efficiency_loss_pts(ddp2, single, ddp1)
    # Each part's seconds ÷ the 0.625 s step, in points.
    want = {"exposed_comm": 6.0, "stragglers": 2.0, "data": 2.0, "ddp_overhead": 4.0,
            "contention": 4.0, "residual": 2.0}  # fmt: skip
    assert parts.pop("host_contention") is None  # no per-step load: nothing to tell apart
    assert parts == pytest.approx(want, abs=1e-9)
    assert sum(parts.values()) == pytest.approx(100 * (1 - 0.8), abs=1e-12)


def test_slowdown_measured_in_busy_steps_is_host_contention_not_ddps():
    """The hand-built DDP run's 25 ms of contention, measured as steps that other processes
    slowed (host_contention_frac = 25 ms of its 625 ms step); the single run's busy steps took
    10% of its step, which flatters the efficiency by E × 10 points."""
    single, ddp1, ddp2 = hand_built()
    single.host_contention_frac, ddp1.host_contention_frac = 0.0, 0.0
    ddp2.host_contention_frac = 0.025 / 0.625
    parts = efficiency_loss_pts(ddp2, single, ddp1)
    assert parts["host_contention"] == pytest.approx(4.0)
    assert parts["contention"] == pytest.approx(0.0, abs=1e-9)  # DDP's own slowdown: none left
    assert sum(parts.values()) == pytest.approx(20.0, abs=1e-12)
    single.host_contention_frac = 0.1
    parts = efficiency_loss_pts(ddp2, single, ddp1)
    assert parts["host_contention"] == pytest.approx(4.0 - 0.8 * 10.0)
    assert parts["contention"] == pytest.approx(8.0)  # compute less the parts carved out
    assert sum(parts.values()) == pytest.approx(20.0, abs=1e-12)


def test_a_group_whose_runs_lack_host_load_folds_it_into_contention():
    single, ddp1, ddp2 = hand_built()
    other = msgspec.structs.replace(ddp2, run_id="ddp2b", seed=1)
    single.host_contention_frac, ddp2.host_contention_frac = 0.0, 0.04  # `other`: no load
    runs = [single, ddp1, ddp2, other]
    groups = [GroupEntry(mode="ddp", world_size=2, run_ids=["ddp2", "ddp2b"],
                         scaling_efficiency_mean=0.8)]  # fmt: skip
    attach_efficiency_loss(runs, groups, _key)
    g = groups[0].efficiency_loss_pts
    assert g["host_contention"] is None
    assert g["contention"] == pytest.approx(4.0)  # 0 + 4 (folded back) and 4: their mean
    assert sum(v or 0.0 for v in g.values()) == pytest.approx(20.0)


def test_without_a_one_rank_ddp_run_its_cost_stays_in_contention():
    single, _, ddp2 = hand_built()
    parts = efficiency_loss_pts(ddp2, single)
    assert parts["ddp_overhead"] is None
    assert parts["contention"] == pytest.approx(8.0)
    assert sum(v or 0.0 for v in parts.values()) == pytest.approx(20.0)


def test_group_split_is_the_mean_and_sums_to_the_group_loss():
    single, ddp1, ddp2 = hand_built()
    other = msgspec.structs.replace(ddp2, run_id="ddp2b", seed=1, samples_per_s=64 / 0.7,
                                    scaling_efficiency=64 / 0.7 / 64 / 2)  # fmt: skip
    runs = [single, ddp1, ddp2, other]
    groups = [GroupEntry(mode="ddp", world_size=2, run_ids=["ddp2", "ddp2b"],
                         scaling_efficiency_mean=(ddp2.scaling_efficiency
                                                  + other.scaling_efficiency) / 2),
              GroupEntry(mode="single", world_size=1, run_ids=["single"],
                         scaling_efficiency_mean=1.0)]  # fmt: skip
    attach_efficiency_loss(runs, groups, _key)
    g = groups[0].efficiency_loss_pts
    assert set(g) == set(PARTS) and groups[1].efficiency_loss_pts is None
    loss = 100 * (1 - groups[0].scaling_efficiency_mean)
    assert sum(v or 0.0 for v in g.values()) == pytest.approx(loss)
    a, b = ddp2.efficiency_loss_pts, other.efficiency_loss_pts
    assert g["exposed_comm"] == pytest.approx((a["exposed_comm"] + b["exposed_comm"]) / 2)
    assert ddp1.efficiency_loss_pts is None  # one rank: nothing to split


def test_real_runs_parts_sum_exactly_to_the_measured_loss(single_mlp_run, ddp_mlp_run):
    data = compare_runs([single_mlp_run, ddp_mlp_run], progress=False)
    (group,) = [g for g in data["groups"] if g["mode"] == "ddp"]
    parts = group["efficiency_loss_pts"]
    assert set(parts) == set(PARTS)
    loss = 100 * (1 - group["scaling_efficiency_mean"])
    assert math.isclose(sum(v or 0.0 for v in parts.values()), loss, abs_tol=1e-9)
    # Real traces: the DDP run has exposed communication, and no part is a NaN.
    assert parts["exposed_comm"] + parts["stragglers"] > 0
    assert all(v is None or math.isfinite(v) for v in parts.values())
