"""Interval arithmetic and the per-step engine on hand-built intervals and a hand-built trace."""

from __future__ import annotations

import json

import numpy as np
import pytest
from msgspec.structs import asdict

from analysis.trace.intervals import clip, intersection_us, merge, total_us, union_us
from analysis.trace.rank import summarize_file


def iv(*pairs: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([p[0] for p in pairs], float), np.array([p[1] for p in pairs], float)


def as_pairs(intervals) -> list[tuple[float, float]]:
    return list(zip(intervals[0].tolist(), intervals[1].tolist(), strict=True))


@pytest.mark.parametrize(
    ("pairs", "merged"),
    [
        ([(0, 10), (2, 5)], [(0, 10)]),  # fully nested
        ([(2, 5), (0, 10), (3, 4)], [(0, 10)]),  # nested, unsorted
        ([(0, 1), (1, 2)], [(0, 2)]),  # touching
        ([(0, 1), (2, 3)], [(0, 1), (2, 3)]),  # disjoint
        ([(0, 4), (3, 6), (8, 9), (5, 7)], [(0, 7), (8, 9)]),  # chained overlaps
        ([(5, 5), (7, 6)], []),  # empty and inverted intervals vanish
        ([], []),
    ],
)
def test_merge(pairs, merged):
    got = merge(*iv(*pairs)) if pairs else merge(np.empty(0), np.empty(0))
    assert as_pairs(got) == merged
    assert total_us(got) == sum(e - s for s, e in merged)


@pytest.mark.parametrize(
    ("comp", "comm", "overlap", "exposed"),
    [
        ([(0, 10)], [(2, 5)], 3, 0),  # comm nested in compute: fully hidden
        ([(2, 5)], [(0, 10)], 3, 7),  # compute nested in comm
        ([(0, 1)], [(1, 2)], 0, 1),  # touching: no overlap
        ([(0, 1)], [(5, 8)], 0, 3),  # disjoint
        ([(0, 4), (6, 10)], [(3, 7)], 2, 2),  # comm bridges a gap in compute
        ([(0, 4), (1, 3)], [(2, 6), (2, 6)], 2, 2),  # duplicates inside each set
        ([], [(0, 5)], 0, 5),  # no compute
        ([(0, 5)], [], 0, 0),  # no comm
    ],
)
def test_intersection_and_exposure(comp, comm, overlap, exposed):
    a = iv(*comp) if comp else (np.empty(0), np.empty(0))
    b = iv(*comm) if comm else (np.empty(0), np.empty(0))
    assert intersection_us(a, b) == overlap
    assert intersection_us(b, a) == overlap
    assert total_us(merge(*b)) - intersection_us(a, b) == exposed
    assert union_us(a, b) == total_us(merge(*a)) + total_us(merge(*b)) - overlap


def test_clip():
    assert as_pairs(clip(iv((0, 10), (12, 20), (25, 30)), 5, 15)) == [(5, 10), (12, 15)]


def _x(cat, name, ts, dur, tid, **args):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1 if tid != "s7" else 0,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def test_engine_on_hand_built_gpu_trace(tmp_path):
    """Two analysed steps (the third is dropped); every expected number worked out by hand."""
    ev = [
        _x("user_annotation", "ProfilerStep#1", 0, 100, 1),
        _x("user_annotation", "ProfilerStep#2", 100, 100, 1),
        _x("user_annotation", "ProfilerStep#3", 200, 100, 1),  # last: dropped
        _x("user_annotation", "data", 0, 5, 1),
        # step 1: compute 10-40 and 30-60 (union 50), comm 50-80 (overlap 10), memcpy 85-90
        _x("cuda_runtime", "cudaLaunchKernel", 6, 1, 1, correlation=1),
        _x("kernel", "gemm", 10, 30, "s7", correlation=1),
        _x("cuda_runtime", "cudaLaunchKernel", 7, 1, 1, correlation=2),
        _x("kernel", "relu", 30, 30, "s7", correlation=2),
        _x(
            "cpu_op",
            "record_param_comms",
            20,
            20,
            1,
            **{
                "Collective name": "allreduce",
                "In msg nelems": 1000,
                "dtype": "Float",
                "Group size": 2,
            },
        ),
        _x("user_annotation", "nccl:all_reduce", 22, 10, 1),
        _x("cuda_runtime", "cudaLaunchKernel", 25, 1, 1, correlation=3),
        _x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 50, 30, "s7", correlation=3),
        _x("cuda_runtime", "cudaMemcpyAsync", 26, 1, 1, correlation=4),
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 85, 5, "s7", correlation=4),
        # step 2: compute 110-130, comm 140-150 (no overlap); launched in step 2
        _x("cuda_runtime", "cudaLaunchKernel", 101, 1, 1, correlation=5),
        _x("kernel", "gemm", 110, 20, "s7", correlation=5),
        _x("user_annotation", "nccl:all_reduce", 102, 5, 1),
        _x("cuda_runtime", "cudaLaunchKernel", 103, 1, 1, correlation=6),
        _x("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float", 140, 10, "s7", correlation=6),
        # step 3 (dropped): a kernel that must not count
        _x("cuda_runtime", "cudaLaunchKernel", 201, 1, 1, correlation=7),
        _x("kernel", "gemm", 210, 50, "s7", correlation=7),
    ]
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(
        json.dumps({"traceEvents": ev, "distributedInfo": {"rank": 0, "world_size": 2}})
    )
    s = asdict(summarize_file(path))  # the RankSummary's fields, by name
    assert s["kind"] == "gpu" and s["steps"] == 2 and s["step_numbers"] == [1, 2]
    one, two = s["per_step"]
    assert (one["compute_us"], one["comm_us"], one["overlap_us"], one["exposed_comm_us"]) == (
        50,
        30,
        10,
        20,
    )
    assert one["busy_us"] == 75 and one["idle_us"] == 25 and one["data_wait_us"] == 5
    assert (two["compute_us"], two["comm_us"], two["overlap_us"], two["exposed_comm_us"]) == (
        20,
        10,
        0,
        10,
    )
    # HTA over both steps' kernels: comp 70, comm 40, overlap 10 -> 25 %; span 10..150 = 140
    assert s["overlap_pct"] == pytest.approx(25.0)
    assert s["hta"]["kernel_time_us"] == 140 and s["hta"]["idle_us"] == 140 - 105
    calls = s["instances"]["nccl:all_reduce"]
    assert calls["bytes"].tolist() == [4000, 0]  # 1000 floats from record_param_comms; 2nd unknown
    assert calls["device_us"].tolist() == [30, 10]
    assert calls["latency_us"].tolist() == [10 + 30, 5 + 10]  # |call ∪ kernel|


def _cpu_trace(tmp_path, *, steps: bool) -> dict:
    """A gloo/CPU rank: training thread 1, gloo thread 2, a background thread 3 (e.g. a saver)."""
    ev = [
        _x("cpu_op", "aten::mm", 10, 30, 1),
        _x("cpu_op", "aten::relu", 40, 5, 1),  # touches mm: training-thread union 10-45
        _x("user_annotation", "gloo:all_reduce", 30, 40, 2),
        _x("cpu_op", "aten::add_", 60, 5, 2),  # gloo's own reduction: part of the collective
        _x("cpu_op", "aten::copy_", 50, 30, 3),  # another thread's op: not the model's compute
    ]
    if steps:
        ev += [
            _x("user_annotation", "ProfilerStep#1", 0, 100, 1),
            _x("user_annotation", "ProfilerStep#2", 100, 100, 1),  # last: dropped
        ]
    path = tmp_path / f"rank0.{steps}.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": ev, "distributedInfo": {"rank": 0}}))
    return asdict(summarize_file(path))


def test_cpu_trace_counts_compute_on_the_training_thread_only(tmp_path):
    """Issue rule: on a CPU trace computation is the cpu_ops of the training thread (the one
    recording ProfilerStep). Counting thread 3 too would give compute 65 and overlap 35."""
    s = _cpu_trace(tmp_path, steps=True)
    (step,) = s["per_step"]
    assert s["kind"] == "cpu" and step["step_time_us"] == 100
    assert (step["compute_us"], step["comm_us"], step["overlap_us"]) == (35, 40, 15)
    assert step["exposed_comm_us"] == 25 and step["busy_us"] == 60 and step["idle_us"] == 40
    assert s["overlap_pct"] == pytest.approx(100 * 15 / 40)


def test_cpu_trace_without_steps_takes_the_busiest_thread(tmp_path):
    s = _cpu_trace(tmp_path, steps=False)
    (step,) = s["per_step"]
    assert step["step_time_us"] == 70  # first to last CPU op: 10-80
    assert (step["compute_us"], step["comm_us"], step["overlap_us"]) == (35, 40, 15)
