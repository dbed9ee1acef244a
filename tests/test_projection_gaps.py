"""The projection's per-bucket idle penalty and per-node host contention (issue 26), on
hand-built run folders whose answers are worked out here by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.cli.main import main as analysis_main
from analysis.cli.project import ranks_list
from analysis.project.comm import collective_time_us, idle_penalty_us, idle_table
from analysis.project.projection import project
from profiler.runfolder.errors import InputError
from tests.test_project import fake_comm, fake_run
from workloads.comm.host import contention_from_times

PHASE_TIMES_S = {"data": 0.001, "forward": 0.004, "backward": 0.008, "optimizer": 0.002}
AR = {"collective": "all_reduce", "alpha_us": 50.0, "bus_gbps": 2.0}
# idle penalty (µs) the sweep measured: rows gap 0, 2, 10 ms; columns 64 KiB, 1 MiB
GAPS_MS, SIZES = (0.0, 2.0, 10.0), (65536, 1 << 20)
PENALTY_US = ((0.0, 0.0), (100.0, 200.0), (500.0, 1000.0))


def _with_metrics(comm: Path, **metrics) -> Path:
    rec = json.loads((comm / "run.json").read_text())
    rec["metrics"] = {**rec["metrics"], **metrics}
    (comm / "run.json").write_text(json.dumps(rec))
    return comm


def _sweep_rows() -> list[dict]:
    """metrics.idle_penalty as bench-comm writes it: back-to-back 1 ms, after the gap + penalty."""
    return [
        {
            "collective": "all_reduce",
            "bytes": b,
            "gap_ms": g,
            "time_us_mean": 1000.0 + p,
            "time_us_mean_back_to_back": 1000.0,
        }  # fmt: skip
        for g, row in zip(GAPS_MS, PENALTY_US, strict=True)
        for b, p in zip(SIZES, row, strict=True)
    ]


def test_idle_penalty_interpolates_in_gap_and_size():
    table = idle_table(_sweep_rows(), {}, {})["all_reduce"]
    assert table == {"gap_ms": [0.0, 2.0, 10.0], "bytes": [65536.0, 1048576.0],
                     "us": [[0.0, 0.0], [100.0, 200.0], [500.0, 1000.0]],
                     "baseline": "gap 0", "timing": "slowest rank"}  # fmt: skip
    model = {"idle_penalty": table}
    assert idle_penalty_us(model, 65536, 6.0) == pytest.approx(300.0)  # halfway from 2 to 10
    assert idle_penalty_us(model, 262144, 2.0) == pytest.approx(150.0)  # halfway in log size
    assert idle_penalty_us(model, 1 << 20, 50.0) == pytest.approx(1000.0)  # flat past 10 ms
    assert idle_penalty_us(model, 4, 1.0) == pytest.approx(50.0)  # flat below 64 KiB
    assert idle_penalty_us({}, 65536, 6.0) == 0.0


def test_every_bucket_pays_the_penalty_at_its_own_gap(tmp_path):
    """Three buckets (64 KiB, 64 KiB, 256 KiB; gradient-ready at 1/6, 2/6 and 6/6 of an 8 ms
    backward) of a model without buffers: the gap before the first bucket is the compute since the
    previous step's last bucket (data + forward + optimizer = 7 ms) plus its ready time; the
    second starts when it is ready, after the first; the third after backward ends."""
    comm = _with_metrics(
        fake_comm(tmp_path / "comm", alpha_us=50.0, bus_gbps=2.0), idle_penalty=_sweep_rows()
    )
    buckets = [65536, 65536, 262144]
    run = fake_run(tmp_path / "s", mode="single", n=1, phases=PHASE_TIMES_S, buckets=buckets)
    out = project(run, comm, [2, 4])
    two, four = out["predictions"]
    ms = 1e-3
    t_small, t_big = 100 + 65536 / 2000, 100 + 262144 / 2000  # α–β at n = 2, µs

    def pen(size_col: float, gap_ms: float) -> float:  # by hand: gap rows 2 and 10 ms
        lo, hi = (100 + 100 * size_col, 500 + 500 * size_col)
        return lo + (gap_ms - 2) / 8 * (hi - lo) if gap_ms >= 2 else gap_ms / 2 * lo

    start0 = 8 / 6  # ms after backward starts
    gap0 = 7 + start0
    end0 = start0 + (t_small + pen(0, gap0)) / 1e3
    start1 = 16 / 6  # ready after the first bucket ended (1.88 ms)
    gap1 = start1 - end0
    end1 = start1 + (t_small + pen(0, gap1)) / 1e3
    gap2 = 8 - end1
    end2 = 8 + (t_big + pen(0.5, gap2)) / 1e3  # 256 KiB: halfway between the columns
    assert two["bucket_gaps_ms"] == pytest.approx([gap0, gap1, gap2], rel=1e-9)
    assert two["exposed_comm_s"] == pytest.approx((end2 - 8) * ms, rel=1e-9)
    assert two["step_time_s"] == pytest.approx(0.015 + (end2 - 8) * ms, rel=1e-9)
    penalties = pen(0, gap0) + pen(0, gap1) + pen(0.5, gap2)
    assert two["idle_penalty_s"] == pytest.approx(penalties / 1e6, rel=1e-9)
    # at n = 4 the α–β part grows, the penalty stays once per call (at that schedule's gaps)
    assert four["idle_penalty_s"] > 0 and four["comm_s"] > two["comm_s"]
    t4 = collective_time_us(AR, 262144, 4)
    assert four["exposed_comm_s"] >= t4 / 1e6
    assert out["inputs"]["idle_penalty_gaps_ms"] == [0.0, 2.0, 10.0]
    assert not [w for w in out["warnings"] if "gap" in w.lower()]
    assert any("at the compute gap before it" in a for a in out["assumptions"])


def test_buffer_broadcast_pays_at_the_gap_since_the_last_bucket(tmp_path):
    """A model with buffers: its broadcast opens forward, so the first bucket's gap is forward
    (4 ms) + its ready time, and the broadcast's is data + optimizer (3 ms) after the bucket."""
    rows = _sweep_rows() + [dict(r, collective="broadcast") for r in _sweep_rows()]
    comm = fake_comm(tmp_path / "comm", alpha_us=50.0, bus_gbps=2.0,
                      collectives=("all_reduce", "broadcast"))  # fmt: skip
    _with_metrics(comm, idle_penalty=rows)
    run = fake_run(tmp_path / "s", mode="single", n=1, phases=PHASE_TIMES_S, buckets=[65536],
                    metrics={"buffer_bytes_by_dtype": {"float32": 65536}})  # fmt: skip
    two = project(run, comm, [2])["predictions"][0]
    assert two["bucket_gaps_ms"] == pytest.approx([4 + 8])  # forward, then the whole backward
    bc = collective_time_us(dict(AR, collective="broadcast"), 65536, 2)
    pen_bc = 100 + (3 - 2) / 8 * 400  # 64 KiB column at 3 ms
    assert two["buffer_broadcast_s"] == pytest.approx((bc + pen_bc) / 1e6, rel=1e-9)


def test_host_contention_is_applied_per_node(tmp_path):
    """Compute slowdown 1.25 with 2 busy ranks on a host: a single-device run projected to 2
    ranks computes 1.25× longer; at 4 ranks over nodes of 2 still 1.25× (per node), on nodes of
    8 flat at the largest measured count; a 2-rank DDP run already carries it (ratio 1)."""
    host = {"device": "cpu", "ranks": [1, 2], "slowdown": [1.0, 1.25], "kernel": "k"}
    comm = _with_metrics(
        fake_comm(tmp_path / "comm", alpha_us=50.0, bus_gbps=2.0), host_contention=host
    )
    single = fake_run(tmp_path / "s", mode="single", n=1, phases=PHASE_TIMES_S, buckets=[65536])
    compute = sum(PHASE_TIMES_S.values())
    out = project(single, comm, [1, 2, 4], gpus_per_node=2)
    one, two, four = out["predictions"]
    assert one["compute_s"] == pytest.approx(compute) and one["contention_factor"] == 1.0
    assert two["compute_s"] == pytest.approx(1.25 * compute)
    assert four["compute_s"] == pytest.approx(1.25 * compute)  # two nodes of 2 ranks each
    assert any("×1.250 at 2 ranks per node" in a for a in out["assumptions"])
    wide = project(single, comm, [4], gpus_per_node=8)
    assert wide["predictions"][0]["contention_factor"] == pytest.approx(1.25)
    assert any("flat past the measured counts" in a for a in wide["assumptions"])
    ddp = fake_run(tmp_path / "d", mode="ddp", n=2, phases=PHASE_TIMES_S, buckets=[65536])
    replay = project(ddp, comm, [4], gpus_per_node=2, traces=False)
    assert replay["predictions"][0]["contention_factor"] == 1.0
    host3 = dict(host, ranks=[1, 2, 3], slowdown=[1.0, 1.25, 1.6])
    _with_metrics(comm, host_contention=host3)
    from_ddp = project(ddp, comm, [3], gpus_per_node=8, traces=False)["predictions"][0]
    assert from_ddp["contention_factor"] == pytest.approx(1.6 / 1.25)


def test_gpu_comm_run_means_a_contention_factor_of_one(tmp_path):
    note = {"device": "cuda", "ranks": [], "slowdown": [], "note": "GPU: not measured, factor 1"}
    comm = _with_metrics(
        fake_comm(tmp_path / "comm", alpha_us=50.0, bus_gbps=2.0), host_contention=note
    )
    single = fake_run(tmp_path / "s", mode="single", n=1, phases=PHASE_TIMES_S, buckets=[65536])
    out = project(single, comm, [2])
    assert out["predictions"][0]["contention_factor"] == 1.0
    assert "GPU: not measured, factor 1" in out["assumptions"]


def test_a_comm_run_measured_on_a_busy_host_is_warned_about(tmp_path):
    comm = fake_comm(tmp_path / "comm", alpha_us=50.0, bus_gbps=2.0)
    rec = json.loads((comm / "run.json").read_text())
    rec["env"] = {"host_load": {"other_cpu_cores_mean": 1.6, "cores": 2}}
    (comm / "run.json").write_text(json.dumps(rec))
    single = fake_run(tmp_path / "s", mode="single", n=1, phases=PHASE_TIMES_S, buckets=[65536])
    (w,) = [w for w in project(single, comm, [2])["warnings"] if "comm run was measured" in w]
    assert "1.6 of 2 cores" in w
    rec["env"]["host_load"]["other_cpu_cores_mean"] = 1.0  # exactly half: not busy
    (comm / "run.json").write_text(json.dumps(rec))
    assert not [w for w in project(single, comm, [2])["warnings"] if "comm run was measured" in w]


def _contention_times(window_ratios: list[float], alone_s: list[float]) -> np.ndarray:
    """times[k − 1, round, rank] of 2 ranks: per window 7 rounds, rank 0 alone at that window's
    speed, both ranks busy at the window's ratio × that."""
    rounds = [(a, r) for a, r in zip(alone_s, window_ratios, strict=True) for _ in range(7)]
    t = np.zeros((2, len(rounds), 2))
    for i, (a, r) in enumerate(rounds):
        t[0, i, 0] = a
        t[1, i, :] = a * r
    return t


def test_one_windows_transient_does_not_set_the_contention_factor():
    # one window of three measured the VM in a bad moment (×1.9); the others ×1.1
    host = contention_from_times(_contention_times([1.9, 1.1, 1.1], [0.012] * 3))
    assert host["slowdown"] == pytest.approx([1.0, 1.1])
    assert host["slowdown_min"] == pytest.approx([1.0, 1.1])
    assert host["slowdown_max"] == pytest.approx([1.0, 1.9])  # the band still spans it
    assert host["time_ms_alone"] == pytest.approx(12.0)


def test_the_contention_ratio_is_paired_within_a_round():
    # the machine's speed moves between windows (10, 20, 30 ms alone) and the fast window is
    # also contended: each round against its own time alone gives ×1.0 in two windows of three;
    # the medians of all busy and all alone times, unpaired, would read 25 ÷ 20 = ×1.25
    host = contention_from_times(_contention_times([2.5, 1.0, 1.0], [0.010, 0.020, 0.030]))
    assert host["slowdown"] == pytest.approx([1.0, 1.0])
    assert host["slowdown_max"] == pytest.approx([1.0, 2.5])
    assert host["time_ms_alone"] == pytest.approx(20.0)


@pytest.mark.parametrize("text", ["2,4,8", "2 4 8", " 2, 4 ,8 ", "2\t4,8"])
def test_ranks_take_commas_or_spaces(tmp_path, text):
    # "2 4 8" once read as rank count 248: a wrong projection, not an error
    assert ranks_list(text) == [2, 4, 8]
    run = fake_run(tmp_path / "s", mode="single", n=1, phases=PHASE_TIMES_S, buckets=[65536])
    comm = fake_comm(tmp_path / "comm", alpha_us=50.0, bus_gbps=2.0)
    argv = [
        "project",
        str(run),
        "--comm",
        str(comm),
        "--ranks",
        text,
        "--json",
        str(tmp_path / "p"),
    ]
    assert analysis_main(argv) == 0
    out = json.loads((tmp_path / "p").read_text())
    assert [p["ranks"] for p in out["predictions"]] == [2, 4, 8]


def test_ranks_that_are_not_integers_are_one_line():
    with pytest.raises(InputError, match=r"--ranks: '2 4x' is not a list of integers"):
        ranks_list("2 4x")
