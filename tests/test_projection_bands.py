"""Issue 37: the band on every prediction, the idle-penalty rule with and without a gap, and the
traced decomposition a self-replay uses, on hand-built inputs whose answers are worked out here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.project.bands import band_text
from analysis.project.comm import COMM_COLUMNS, collective_time_us, idle_table, nondecreasing
from analysis.project.projection import project
from analysis.project.step import bucket_timeline
from analysis.project.traced import bucket_calls, exposed_share
from analysis.project.view import Prediction
from analysis.report.projection import speedup_text
from tests.test_project import fake_run

AR = {"collective": "all_reduce", "alpha_us": 50.0, "bus_gbps": 2.0}
BUCKET = 1 << 20  # a benchmarked size: every curve gives its own time back there
TIMES = [0.010 + 0.001 * k for k in range(11)]  # the measured steps: 10, 11, ... 20 ms
SHARES = {"data": 0.1, "forward": 0.3, "backward": 0.4, "optimizer": 0.2}


def _band_comm(path: Path) -> Path:
    """A comm run whose last-arriving rank's means follow α–β t(s) exactly, its p5 = t/2 and p95
    = 2t; host contention ×1.25 at 2 ranks, ×1.1 to ×1.5 over its rounds."""
    path.mkdir(parents=True)
    rows, means = [], []
    for nbytes in (1024, 65536, BUCKET, 1 << 22):
        t = collective_time_us(AR, nbytes, 2)
        rows.append(dict(collective="all_reduce", backend="gloo", world_size=2, bytes=nbytes,
                         iters=30, time_us_median=1.1 * t, time_us_p95=3 * t,
                         algbw_gbps=nbytes / t / 1e3, busbw_gbps=nbytes / t / 1e3))  # fmt: skip
        means.append({"collective": "all_reduce", "bytes": nbytes, "time_us_mean": 1.2 * t,
                      "time_us_mean_last_arrival": t, "time_us_p5_last_arrival": t / 2,
                      "time_us_p95_last_arrival": 2 * t})  # fmt: skip
    pd.DataFrame(rows, columns=COMM_COLUMNS).to_csv(path / "comm.csv", index=False)
    host = {"device": "cpu", "ranks": [1, 2], "slowdown": [1.0, 1.25],
            "slowdown_min": [1.0, 1.1], "slowdown_max": [1.0, 1.5]}  # fmt: skip
    rec = {"kind": "comm", "run_id": path.name, "status": "ok",
           "config": {"backend": "gloo", "world_size": 2},
           "metrics": {"time_us_mean": means, "host_contention": host}}  # fmt: skip
    (path / "run.json").write_text(json.dumps(rec))
    return path


def _spread_run(path: Path) -> Path:
    """A single-device run (batch 32) whose 11 measured steps take TIMES, each split by SHARES."""
    run = fake_run(path, mode="single", n=1, phases=SHARES, buckets=[BUCKET])
    rows = [{"rank": 0, "step": s, "warmup": int(s < 2), "step_time_s": t,
             **{f"{k}_s": v * t for k, v in SHARES.items()}}
            for s, t in enumerate([0.015, 0.015, *TIMES])]  # fmt: skip
    pd.DataFrame(rows).to_csv(run / "steps.csv", index=False)
    return run


def test_band_by_hand(tmp_path):
    """Weak scaling to 2 ranks of a 15 ms mean step (10..20 ms) with one 1 MiB bucket ready when
    backward ends. The compute band is p5..p95 of the steps ÷ their mean (10.5 and 19.5 ms:
    ×0.7, ×1.3), the contention ×1.1..×1.5 around ×1.25, the all-reduce t/2..2t around t; the
    straggler E[max of 2] − mean = Σ x₍ₖ₎(2k−1)/121 − 15 ms, scaled like compute."""
    out = project(_spread_run(tmp_path / "s"), _band_comm(tmp_path / "comm"), [1, 2])
    one, two = out["predictions"]
    t = collective_time_us(AR, BUCKET, 2) / 1e6
    e_max2 = sum(x * (2 * k - 1) for k, x in enumerate(TIMES, start=1)) / 121
    wait = e_max2 - 0.015  # at the point estimate's compute, before contention
    ends = {"point": (1.0, 1.25, t), "low": (0.7, 1.1, t / 2), "high": (1.3, 1.5, 2 * t)}
    step2 = {k: 0.015 * f * c + wait * f * c + comm for k, (f, c, comm) in ends.items()}
    step1 = {k: 0.015 * f for k, (f, _, _) in ends.items()}
    assert two["step_time_s"] == pytest.approx(step2["point"], rel=1e-9)
    assert two["step_time_s_low"] == pytest.approx(step2["low"], rel=1e-9)
    assert two["step_time_s_high"] == pytest.approx(step2["high"], rel=1e-9)
    speedup = {k: 2 * step1[k] / step2[k] for k in ends}
    assert two["speedup"] == pytest.approx(speedup["point"], rel=1e-9)
    assert two["speedup_low"] == pytest.approx(min(speedup.values()), rel=1e-9)
    assert two["speedup_high"] == pytest.approx(max(speedup.values()), rel=1e-9)
    assert two["scaling_efficiency_high"] == pytest.approx(max(speedup.values()) / 2, rel=1e-9)
    assert (one["step_time_s_low"], one["step_time_s_high"]) == pytest.approx((0.0105, 0.0195))
    assert (one["speedup_low"], one["speedup_high"]) == pytest.approx((1.0, 1.0))
    sources = {s["term"]: (s["low"], s["high"]) for s in two["band_sources"]}
    assert sources["compute"] == pytest.approx((0.7, 1.3))
    assert sources["contention_factor"] == pytest.approx((1.1, 1.5))
    assert sources["exposed_comm_s"] == pytest.approx((t / 2, 2 * t))
    assert [s["term"] for s in one["band_sources"]] == ["compute"]  # n = 1: no comm, no contention


def test_band_fields_are_ordered_at_every_n(tmp_path):
    out = project(_spread_run(tmp_path / "s"), _band_comm(tmp_path / "comm"), [1, 2, 4, 16, 256])
    for p in out["predictions"]:
        for key in ("step_time_s", "speedup", "scaling_efficiency"):
            assert p[f"{key}_low"] <= p[key] <= p[f"{key}_high"], (p["ranks"], key)
        assert all(s["source"] for s in p["band_sources"])
    replay = out["replay"]  # a single-device run's replay is exact and inside its band
    assert replay["in_band"] and replay["error_pct"] == pytest.approx(0.0)


def test_band_text_is_never_a_bare_number():
    assert band_text(1.7, 1.5, 1.9, "{:.1f}", "×") == "1.7× (1.5–1.9×)"
    p = Prediction(ranks=8, speedup=1.7, speedup_low=1.5, speedup_high=1.9)
    assert speedup_text(p) == "1.70× (1.50–1.90×) at 8 ranks"


def _sweep(last: bool = False) -> list[dict]:
    """The sweep's rows: back-to-back 1000 µs; the first call 1400 µs after no gap (the barrier's
    arrival skew), 1900 after 2 ms, 2600 after 10 ms; with `last`, the last-arriving rank's 300
    µs less at every gap."""
    first = {0.0: 1400.0, 2.0: 1900.0, 10.0: 2600.0}
    return [
        {"collective": "all_reduce", "bytes": b, "gap_ms": g, "time_us_mean": t,
         "time_us_mean_back_to_back": 1000.0,
         **({"time_us_mean_last_arrival": t - 300.0} if last else {})}
        for b in (65536, BUCKET) for g, t in first.items()
    ]  # fmt: skip


def test_idle_penalty_is_what_the_gap_adds_to_a_call_after_no_gap():
    """p(s, g) = first(g) − first(0): 0, 500 and 1200 µs (not first − back-to-back: 400, 900,
    1600, which charged the barrier's skew to every bucket, even one that follows the bucket
    before it without a gap); the last-arriving rank's times where the sweep has them."""
    table = idle_table(_sweep(), {}, {})["all_reduce"]
    assert table["us"] == [[0.0, 0.0], [500.0, 500.0], [1200.0, 1200.0]]
    assert (table["baseline"], table["timing"]) == ("gap 0", "slowest rank")
    last = idle_table(_sweep(last=True), {}, {})["all_reduce"]
    assert last["us"] == table["us"] and last["timing"] == "last arrival"
    assert list(nondecreasing(np.array([0.0, 3.0, 1.0, 5.0]))) == [0.0, 2.0, 2.0, 5.0]
    assert list(nondecreasing(np.array([5.0, 1.0, 0.0]))) == [2.0, 2.0, 2.0]


@pytest.mark.parametrize(
    ("ready_ms", "want_gaps_ms", "want_pen_us"),
    [
        # no gap: bucket 1 is ready (1.0 ms) before bucket 0 ends (2.81125 ms): it queues, pays 0
        ((0.5, 1.0), (7.5, 0.0), (981.25, 0.0)),
        # a gap: ready at 4.0 ms, 1.18875 ms after bucket 0 ended: 1.18875 / 2 × 500 µs
        ((0.5, 4.0), (7.5, 1.18875), (981.25, 297.1875)),
    ],
)
def test_bucket_pays_the_penalty_of_its_own_gap(ready_ms, want_gaps_ms, want_pen_us):
    """Two buckets of 64 KiB, 1.33 and 0.2 ms of α–β, 7 ms of compute before backward: bucket
    0's gap is 7 + 0.5 ms, its penalty 500 + 5.5/8 × 700 µs (between the 2 and 10 ms rows)."""
    from analysis.project.comm import idle_penalty_us

    model = {"idle_penalty": idle_table(_sweep(), {}, {})["all_reduce"]}
    line = bucket_timeline([r / 1e3 for r in ready_ms], [1.33e-3, 0.2e-3], lead_s=7e-3,
                           penalty=lambda k, gap: idle_penalty_us(model, 65536, 1e3 * gap) / 1e6)  # fmt: skip
    assert [1e3 * g for _, g, _ in line] == pytest.approx(want_gaps_ms, rel=1e-9)
    pens = [d - c for (_, _, d), c in zip(line, [1.33e-3, 0.2e-3], strict=True)]
    assert [1e6 * p for p in pens] == pytest.approx(want_pen_us, rel=1e-9, abs=1e-9)


def test_the_ranks_arrival_skew_hides_that_much_of_the_idle_penalty(tmp_path):
    """Weak scaling to 2 ranks of the 10..20 ms steps, one bucket ready when backward ends, about
    19 ms of compute after the previous step's bucket: the sweep (ranks arriving together) says
    a call after that gap pays 3 ms more (flat past its 10 ms cell). In a step the first rank
    waits E[max of 2] − mean of the steps (× the contention ×1.25, like all compute) for the
    last, its transport awake: the point estimate pays 3 ms less that; the band's high end all 3
    ms, its low end none."""
    comm = _band_comm(tmp_path / "comm")
    rec = json.loads((comm / "run.json").read_text())
    rec["metrics"]["idle_penalty"] = [
        {"collective": "all_reduce", "bytes": b, "gap_ms": g, "time_us_mean": t,
         "time_us_mean_back_to_back": 1000.0, "time_us_mean_last_arrival": t}
        for b in (65536, BUCKET) for g, t in ((0.0, 1400.0), (10.0, 4400.0))
    ]  # fmt: skip
    (comm / "run.json").write_text(json.dumps(rec))
    (two,) = project(_spread_run(tmp_path / "s"), comm, [2])["predictions"]
    skew = (sum(x * (2 * k - 1) for k, x in enumerate(TIMES, start=1)) / 121 - 0.015) * 1.25
    assert 0 < skew < 0.003  # partly hidden
    t = collective_time_us(AR, BUCKET, 2) / 1e6
    assert two["idle_penalty_s"] == pytest.approx(0.003 - skew, rel=1e-9)
    assert two["exposed_comm_s"] == pytest.approx(t + 0.003 - skew, rel=1e-9)
    sources = {s["term"]: (s["low"], s["high"]) for s in two["band_sources"]}
    assert sources["exposed_comm_s"] == pytest.approx((t / 2, 2 * t + 0.003), rel=1e-9)
    assert two["step_time_s_low"] <= two["step_time_s"] <= two["step_time_s_high"]


def _rank(exposed: list[float], starts: list[float], lats: list[float], fwd_bcast: float) -> dict:
    """A rank row of two 10 ms traced steps: forward at 0 and 10 ms (1 ms long, one broadcast of
    `fwd_bcast` µs at its start), backward from 2 to 8 ms of each step, one bucket per step."""
    phases = [{"phase": p, "start_us": 1e4 * i + a, "end_us": 1e4 * i + b}
              for i in range(2) for p, a, b in (("forward", 0, 1e3), ("backward", 2e3, 8e3))]  # fmt: skip
    return {
        "per_step": [{"step": i, "step_time_us": 1e4, "exposed_comm_us": e}
                     for i, e in enumerate(exposed)],  # fmt: skip
        "exposed_comm_us": float(np.mean(exposed)), "step_time_us_mean": 1e4,
        "memory": {"phases": phases},
        "instances": {
            "gloo:all_reduce": {"start_us": starts, "latency_us": lats},
            "gloo:broadcast": {"start_us": [0.0, 1e4], "latency_us": [fwd_bcast, fwd_bcast]},
        },
    }  # fmt: skip


def test_traced_decomposition_takes_the_last_rank_to_arrive():
    """Rank 0 arrives at the all-reduce at 5 ms and waits (3 ms calls), rank 1 at 7 ms (1 ms):
    the step's comm is rank 1's, the last to arrive; rank 0's extra wait is rank skew. The
    exposed share is the per-step minimum over ranks ÷ the mean step."""
    r0 = _rank([3000.0, 2500.0], [5e3, 1.5e4], [3000.0, 2500.0], 200.0)
    r1 = _rank([1000.0, 1500.0], [7e3, 1.65e4], [1000.0, 1500.0], 100.0)
    assert exposed_share([r0, r1]) == pytest.approx((1000 + 1500) / 2 / 1e4)
    calls = bucket_calls([r0, r1], 1)
    assert calls["bucket_us"] == pytest.approx([1250.0])  # min over ranks, then the mean
    # gap: from the end of rank 1's broadcast (100 µs) to its call (7 ms, then 16.5 − 10.1 ms)
    assert calls["bucket_gaps_us"] == pytest.approx([(6900.0 + 6400.0) / 2])
    assert calls["broadcast_us"] == pytest.approx([100.0]) and calls["steps"] == 2
    # the frame is rank 1 (the step waited for it): exposed 1000 and 1500 µs of 10 ms steps
    assert calls["exposed_share"] == pytest.approx(0.125) and calls["step_time_us"] == 1e4
    # its backward compute before the comm: 6 ms − (exposed − its 100 µs broadcast) − finalize 0
    # = 5.1 and 4.6 ms; the calls started at 5.0 and 4.5 ms into backward: 100 µs before that
    assert calls["bucket_lead_us"] == pytest.approx([100.0]) and calls["finalize_us"] == 0.0
    assert bucket_calls([r0, r1], 2) is None  # no step holds two buckets
    legacy = [{"exposed_comm_us": 800.0, "step_time_us_mean": 1e4},
              {"exposed_comm_us": 500.0, "step_time_us_mean": 1e4}]  # fmt: skip
    assert exposed_share(legacy) == pytest.approx(0.05)  # no per-step rows: the smallest share


@pytest.mark.parametrize(
    ("ready_ms", "want_exposed_ms"),
    [
        # bucket 1 ready at 4 ms queues behind bucket 0 (1 -> 5 ms): 5 -> 8, 1 ms past 7 ms
        ((1.0, 4.0), 1.0),
        # ready at 6 ms, after bucket 0 ended: 6 -> 9 ms, 2 ms past the compute
        ((1.0, 6.0), 2.0),
    ],
)
def test_self_replay_arithmetic_by_hand(tmp_path, ready_ms, want_exposed_ms):
    """The self-replay's inputs: two traced buckets of 4 and 3 ms at the run's own ready times,
    1 ms of finalize after them: the exposure counts from the end of the 7 ms of backward compute
    before the communication, one bucket after another."""
    from analysis.project.inputs import load_training
    from analysis.project.step import predict_step

    ddp = fake_run(tmp_path / "d", mode="ddp", n=2, buckets=[1000, 2000],
                    phases={"data": 0.001, "forward": 0.004, "backward": 0.008, "optimizer": 0.002})  # fmt: skip
    run = load_training(ddp, traces=False)
    traced = {"bucket_s": [4e-3, 3e-3], "broadcast_s": [], "finalize_s": 1e-3,
              "ready_s": [r / 1e3 for r in ready_ms]}  # fmt: skip
    kw = dict(scaling="weak", comm_model=AR, gpn=8, inter_gbps=100.0, batch_runs={}, wire=1.0,
              bcast=None, host={})  # fmt: skip
    p = predict_step(run, 2, traced=traced, **kw)
    assert p["exposed_comm_s"] == pytest.approx(want_exposed_ms / 1e3, rel=1e-9)
    assert p["step_time_s"] == pytest.approx(0.015 + want_exposed_ms / 1e3, rel=1e-9)
    assert p["idle_penalty_s"] == 0.0 and p["comm_s"] == pytest.approx(7e-3)


def test_lanes_let_calls_run_at_once():
    """Gloo's two worker threads run two buckets at once: with 2 lanes both start when ready
    (0 and 0.5 s) and the third waits for the first free lane (the first ends at 3 s); with one
    lane each waits for the one before it."""
    two = bucket_timeline([0.0, 0.5, 1.0], [3.0, 4.0, 1.0], lanes=2)
    assert [(s, g) for s, g, _ in two] == [(0.0, 0.0), (0.5, 0.5), (3.0, 0.0)]
    one = bucket_timeline([0.0, 0.5, 1.0], [3.0, 4.0, 1.0])
    assert [s for s, _, _ in one] == [0.0, 3.0, 7.0]


def test_bench_summary_counts_coverage_and_marks_misses():
    """bench-projection's summary over hand-built rounds: medians, ranges, coverage, and the
    markdown table the docs show (misses in bold)."""
    from bench.projection import BANDED, COVERAGE_GOAL, GOALS_PCT
    from bench.projection_summary import bench_results, markdown_table, summary

    def rnd(weak: float, inside: bool, replay: float, self_: float | None) -> dict:
        check = {"error_pct": weak, "in_band": inside}
        return {"workloads": {"mlp": {
            "weak": check, "weak_ddp1": check,
            "replay": {"error_pct": replay, "in_band": True, "measured_step_time_s": 0.02},
            "self_replay": {"error_pct": self_}, "exposed": {"error_pct": 4.0},
            "pair_contention_pct": 10.0,
        }}}  # fmt: skip

    rounds = [rnd(-12.0, False, 1.0, 0.5), rnd(3.0, True, 9.0, None), rnd(5.0, True, 2.0, -1.0)]
    summ = summary(rounds, ["mlp"], GOALS_PCT, BANDED, COVERAGE_GOAL)["mlp"]
    assert summ["weak"]["median_error_pct"] == 3.0 and summ["weak"]["covered"] == 2
    assert summ["weak"]["coverage"] == pytest.approx(2 / 3) and not summ["weak"]["coverage_met"]
    assert summ["self_replay"]["rounds"] == 2 and summ["self_replay"]["median_error_pct"] == -0.25
    assert summ["replay"]["met"] and summ["ddp_step_ms"] == [20.0, 20.0]
    table = markdown_table({"mlp": summ}, 3, BANDED, COVERAGE_GOAL)
    row = next(line for line in table.splitlines() if line.startswith("| mlp "))
    assert row == ("| mlp | 20–20 ms | +3.0% (−12.0 … +5.0), **in band 2/3** | +3.0% (−12.0 … +5.0)"
                   ", **in band 2/3** | +2.0% (+1.0 … +9.0), in band 3/3 | −0.2% (−1.0 … +0.5) |"
                   " +4.0% (+4.0 … +4.0) |")  # fmt: skip
    assert "met 6 of 8" in table  # 5 medians, all met; 3 coverages, 1 met
    assert bench_results({"mlp": summ})["mlp"]["weak_coverage"] == pytest.approx(2 / 3)
