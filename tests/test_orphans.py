"""The orphan-kernel rule (docs/reference/metrics.md §3) against HTA 0.5.0's own outputs on a real trace,
where HTA applies it (two or more ProfilerStep names) and where it does not (one).

HTA's pair tests/data/hta/trace_filter is edited by bench/orphan_edit.py: the runtime launches of
the first 60 GPU events of rank 0 and of the first 200 of rank 1 are removed (NCCL kernels among
them), as when GPU work was queued before the profiler went active. HTA's figures on that edited
pair are stored in tests/data/hta_orphans/hta_0.5.0.json (how: tests/data/README.md), so the
suite does not need HTA.
"""

from __future__ import annotations

import gzip
import json
import shutil
from decimal import Decimal

import msgspec
import pytest

from analysis.runs.compare import compare_runs
from analysis.trace.classify import COMPUTE, kernel_class
from analysis.trace.folder import analyze_trace_dir
from bench.orphan_edit import EDITS, REFERENCE, SINGLE_REFERENCE, SOURCE, write_edited_pair
from tests.conftest import DATA

_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[dict, dict]:
    """(dpscope on the original pair, dpscope on the edited pair)."""
    out = tmp_path_factory.mktemp("orphans")
    write_edited_pair(SOURCE, out)
    original = analyze_trace_dir(SOURCE, workers=1, progress=False)
    return original, analyze_trace_dir(out, workers=1, progress=False)


def _first_gpu_us(name: str, n: int) -> float:
    """Σ dur of the first `n` GPU events of a source trace, read straight from its JSON."""
    events = json.loads(gzip.decompress((SOURCE / name).read_bytes()))["traceEvents"]
    gpu = sorted(
        (e for e in events if e.get("cat") in _GPU_CATS),
        key=lambda e: (e["ts"], e["args"]["correlation"]),
    )
    return float(sum(e["dur"] for e in gpu[:n]))


def test_orphan_figures_equal_hta_on_the_edited_trace(pair):
    _, edited = pair
    ref = json.loads(REFERENCE.read_text())
    overlap = {o["rank"]: o["comp_comm_overlap_pctg"] for o in ref["comm_comp_overlap"]}
    ranks = {r["rank"]: r for r in edited["ranks"]}
    for row in ref["temporal_breakdown"]:
        r = ranks[row["rank"]]
        hta, kernel_us = r["hta"], row["kernel_time(us)"]
        assert hta["kernel_time_us"] == kernel_us
        assert hta["idle_us"] == row["idle_time(us)"]
        assert hta["compute_pct"] * kernel_us / 100 == pytest.approx(row["compute_time(us)"])
        assert hta["non_compute_pct"] * kernel_us / 100 == pytest.approx(
            row["non_compute_time(us)"]
        )
        assert round(hta["idle_pct"], 2) == row["idle_time_pctg"]
        assert round(hta["compute_pct"], 2) == row["compute_time_pctg"]
        assert round(r["overlap_pct"], 2) == overlap[row["rank"]]
        # The per-step split leaves them out too: the one analysed step launched every kept kernel.
        assert r["per_step"][0]["compute_us"] == row["compute_time(us)"]


@pytest.fixture(scope="module")
def single_step(tmp_path_factory) -> dict:
    """dpscope on the edited pair without its last ProfilerStep: one step name in the folder."""
    out = tmp_path_factory.mktemp("orphans-single")
    write_edited_pair(SOURCE, out, single_step=True)
    return analyze_trace_dir(out, workers=1, progress=False)


def test_a_single_step_trace_keeps_every_kernel_as_hta_does(single_step):
    """HTA filters orphans (and drops the last step) only where the traces hold two or more
    ProfilerStep names; with one it keeps every kernel. Wave 3 dropped the orphans of a
    single-step trace anyway, moving compute and idle off HTA's by points."""
    ref = json.loads(SINGLE_REFERENCE.read_text())
    overlap = {o["rank"]: o["comp_comm_overlap_pctg"] for o in ref["comm_comp_overlap"]}
    ranks = {r["rank"]: r for r in single_step["ranks"]}
    for row in ref["temporal_breakdown"]:
        r = ranks[row["rank"]]
        hta = r["hta"]
        assert hta["kernel_time_us"] == row["kernel_time(us)"]
        assert hta["idle_us"] == row["idle_time(us)"]
        assert hta["compute_pct"] * row["kernel_time(us)"] / 100 == pytest.approx(
            row["compute_time(us)"]
        )
        assert round(hta["idle_pct"], 2) == row["idle_time_pctg"]
        assert round(hta["compute_pct"], 2) == row["compute_time_pctg"]
        assert round(r["overlap_pct"], 2) == overlap[row["rank"]]
        assert r["steps"] == 1 and r["per_step"][0]["compute_us"] == row["compute_time(us)"]
    for r, name in zip(single_step["ranks"], EDITS, strict=True):  # counted, and kept
        assert r["orphan_kernels"] == EDITS[name]
        (line,) = [w for w in single_step["warnings"] if name in w and "no launch" in w]
        assert "kept in the step split and the HTA figures" in line


def test_a_single_step_rank_among_two_step_ranks_is_named(tmp_path):
    """HTA decides over every rank's step names together; a rank dpscope analysed alone as
    single-step, in a folder holding two names, is named (HTA would drop its only step)."""
    write_edited_pair(SOURCE, tmp_path)
    single = tmp_path / "single"
    write_edited_pair(SOURCE, single, single_step=True)
    name = "sampled_rank-1.json.gz"
    (single / name).replace(tmp_path / name)
    shutil.rmtree(single)
    result = analyze_trace_dir(tmp_path, workers=1, progress=False)
    (line,) = [w for w in result["warnings"] if "HTA would filter this rank too" in w]
    assert (
        line.startswith(str(tmp_path / name)) and "1 ProfilerStep(s) here but 2 step names" in line
    )


def test_orphans_counted_per_rank_with_one_warning(pair):
    original, edited = pair
    for r, name in zip(edited["ranks"], EDITS, strict=True):
        assert r["orphan_kernels"] == EDITS[name]
        assert r["orphan_kernel_us"] == pytest.approx(_first_gpu_us(name, EDITS[name]))
        mine = [w for w in edited["warnings"] if name in w and "no launch in the trace" in w]
        assert len(mine) == 1 and f"{EDITS[name]} GPU event(s)" in mine[0]
    assert all(r["orphan_kernels"] == 0 and r["orphan_kernel_us"] == 0 for r in original["ranks"])
    assert not any("no launch in the trace" in w for w in original["warnings"])


def test_orphans_never_become_calls_and_matching_holds(pair):
    """Ranks with different orphan counts keep the same calls, so the k-th call still matches."""
    original, edited = pair

    def calls(result: dict) -> dict:
        return {(c["rank"], c["name"]): c["calls"] for c in result["collectives_per_rank"]}

    assert calls(edited) == calls(original)
    assert not any(c["name"] == "nccl:send_recv" for c in edited["collectives"])
    assert [s["matched_calls"] for s in edited["stragglers"]] == [
        s["matched_calls"] for s in original["stragglers"]
    ]


# --- nanosecond timestamps (docs/reference/metrics.md §1) ---------------------------------------------

NS_TRACE = DATA / "hta" / "nccl_parser_config" / "nccl_data.json.gz"


def _exact_ns(value) -> int:
    return int(Decimal(str(value)) * 1000)


def _union_ns(spans: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(spans):  # integer interval union
        if end is None or s > end:
            total, end = total + (e - s), e
        elif e > end:
            total, end = total + (e - end), e
    return total


def _exact_ns_figures() -> tuple[list[int], int]:
    """(|∪ compute kernels| per analysed step, HTA's kernel time = last end − first start of the
    analysed kernels), in integer ns straight from the JSON text (every `ts`/`dur` a Decimal):
    a kernel is in the step whose range holds its launch."""
    events = json.loads(gzip.decompress(NS_TRACE.read_bytes()), parse_float=Decimal)
    events = events["traceEvents"]
    launch = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") == "cuda_runtime"}
    steps = sorted(
        (_exact_ns(e["ts"]), _exact_ns(e["ts"]) + _exact_ns(e["dur"]))
        for e in events
        if e.get("name", "").startswith("ProfilerStep#")
    )[:-1]  # the last step is not analysed (HTA's rule)
    compute, every = [], []
    for lo, hi in steps:
        mine = [
            (e, (_exact_ns(e["ts"]), _exact_ns(e["ts"]) + _exact_ns(e["dur"])))
            for e in events
            if e.get("cat") in _GPU_CATS and lo <= _exact_ns(launch[e["args"]["correlation"]]) <= hi
        ]
        compute.append(
            _union_ns([s for e, s in mine if kernel_class(e["name"], e["cat"]) == COMPUTE])
        )
        every += [s for _, s in mine]
    return compute, max(e for _, e in every) - min(s for s, _ in every)


def _assert_exact(rank: dict) -> None:
    compute, kernel_time = _exact_ns_figures()
    assert len(compute) == len(rank["per_step"]) == 2
    for row, ns in zip(rank["per_step"], compute, strict=True):
        assert abs(row["compute_us"] - ns / 1000) < 1e-6  # sub-ns: float64 absolute ts is ~1 ns
    assert abs(rank["hta"]["kernel_time_us"] - kernel_time / 1000) < 1e-6


def test_nanosecond_trace_keeps_exact_kernel_time():
    """Kineto ≥ 2.3 writes ns-resolution `ts`; the per-step compute time is the exact sum."""
    _assert_exact(analyze_trace_dir(NS_TRACE.parent, workers=1, progress=False)["ranks"][0])


def test_absolute_clock_nanosecond_trace_is_exact(tmp_path):
    """The same trace on the absolute epoch clock (ts ≈ 1.7e15 µs, where float64 holds only
    0.25 µs): the fractional times are decoded exactly, so the numbers do not move."""
    shift = Decimal(1_711_964_646_000_000)
    trace = json.loads(gzip.decompress(NS_TRACE.read_bytes()), parse_float=Decimal)
    for e in trace["traceEvents"]:
        if "ts" in e:
            e["ts"] += shift
    del trace["baseTimeNanoseconds"]
    encoder = msgspec.json.Encoder(decimal_format="number")
    (tmp_path / "rank0.json").write_bytes(encoder.encode(trace))
    assert b'"ts":1716423' in (tmp_path / "rank0.json").read_bytes()[:100000]
    _assert_exact(analyze_trace_dir(tmp_path, workers=1, progress=False)["ranks"][0])


def test_orphans_reach_the_run_warnings(tmp_path, ddp_mlp_run):
    run = tmp_path / "run"
    shutil.copytree(ddp_mlp_run, run)
    shutil.rmtree(run / "traces")
    write_edited_pair(SOURCE, run / "traces")
    (entry,) = compare_runs([run], progress=False)["runs"]
    for name, n in EDITS.items():
        assert any(name in w and f"{n} GPU event(s) with no launch" in w for w in entry["warnings"])
