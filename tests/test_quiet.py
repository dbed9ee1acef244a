"""Issue 33: per-step host load and the quiet-step headline. Hand-built steps.csv frames where
every figure is known by construction, the same folders read through the runs JSON (headline,
phases, the verdict's quiet-step figure or its refusal), the reader's rules for the new column,
and the step meter on this process (its own CPU is never "other")."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from analysis.report.verdict import NOT_ENOUGH_QUIET, verdict
from analysis.runs.compare import WORKLOAD_KEY, compare_runs
from profiler.runfolder.hostload import QUIET_OTHER_CORES_FRAC, STEP_LOAD_WINDOW_S, StepLoadMeter
from profiler.runfolder.layout import STEPS_COLUMNS, write_run_json, write_steps_csv
from profiler.runfolder.quiet import MIN_QUIET_STEPS, cores_in_use, quiet_summary, run_headline
from profiler.runfolder.records import InvalidRecord, read_record
from profiler.runfolder.steps import read_steps_frame

QUIET_S, BUSY_S = 0.1, 0.3  # seconds per step, quiet and busy


def step_rows(quiet: int, busy: int, *, world: int = 2, load=(0.2, 1.5), profiled=()) -> list:
    """Two warm-up steps, then `quiet` steps at QUIET_S with rank 0 recording `load[0]` cores of
    other processes, then `busy` at BUSY_S recording `load[1]`; 64 samples per step in all."""
    rows = []
    kinds = ["warmup"] * 2 + ["quiet"] * quiet + ["busy"] * busy
    for step, kind in enumerate(kinds):
        t = BUSY_S if kind == "busy" else QUIET_S
        for rank in range(world):
            rows.append({"rank": rank, "epoch": 0, "step": step, "warmup": int(kind == "warmup"),
                         "profiled": int(step in profiled), "step_time_s": t, "data_s": 0.1 * t,
                         "forward_s": 0.4 * t, "backward_s": 0.4 * t, "optimizer_s": 0.1 * t,
                         "samples": 64 // world, "loss": 1.0,
                         "other_cpu_cores": (load[0] if kind != "busy" else load[1]) if rank == 0 else None})  # fmt: skip
    return rows


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=STEPS_COLUMNS)


def test_quiet_steps_and_the_headline_of_a_half_busy_run():
    q = quiet_summary(frame(step_rows(10, 10)), cores=2)
    assert q["quiet_threshold_cores"] == 0.5 == QUIET_OTHER_CORES_FRAC * 2
    assert (q["quiet_steps"], q["busy_steps"]) == (10, 10)  # rank 1's rows go with rank 0's
    assert q["samples_per_s_quiet"] == pytest.approx(64 * 10 / (10 * QUIET_S))  # 640
    assert q["throughput_basis"] == "quiet" and q["host_contention_frac"] == 0.0
    assert int(q["mask"].sum()) == 20  # both ranks' rows of the 10 quiet steps


def test_fewer_than_eight_quiet_steps_keep_the_all_steps_headline():
    q = quiet_summary(frame(step_rows(MIN_QUIET_STEPS - 1, 10)), cores=2)
    assert q["quiet_steps"] == 7 and q["throughput_basis"] == "all"
    all_sps = 64 * 17 / (7 * QUIET_S + 10 * BUSY_S)
    # what the busy steps cost: 1 − all-steps pace ÷ quiet pace = (3.7 − 1.7) / 3.7 of the time
    assert q["host_contention_frac"] == pytest.approx(1 - all_sps / 640)
    assert q["host_contention_frac"] == pytest.approx((7 * 0.1 + 10 * 0.3 - 17 * 0.1) / 3.7)


def test_the_threshold_is_inclusive_per_core_in_use_and_skips_profiled_steps():
    rows = step_rows(9, 3, load=(0.5, 0.51), profiled={2})  # 0.5 = 0.25 × 2 cores: quiet
    q = quiet_summary(frame(rows), cores=2)
    assert (q["quiet_steps"], q["busy_steps"]) == (8, 3)  # step 2 was traced: not a throughput step
    assert quiet_summary(frame(rows), cores=1)["quiet_steps"] == 0  # 0.25 of 1 core in use
    assert quiet_summary(frame(rows), cores=2, frac=1.0)["busy_steps"] == 0


def test_a_step_whose_next_window_reaches_back_into_it_takes_that_load_too():
    """A burst that begins late in a short step shows first in the next step's window (it spans
    the last 0.2 s, STEP_LOAD_WINDOW_S): that step is not quiet either. A next step longer than
    the window measures only itself and says nothing about this one."""
    assert STEP_LOAD_WINDOW_S == 0.2
    rows = step_rows(10, 0)  # 10 quiet steps of 0.1 s (steps 2-11)
    for r in rows:
        if r["step"] == 7:
            r["step_time_s"], r["other_cpu_cores"] = 0.15, (1.5 if r["rank"] == 0 else None)
    q = quiet_summary(frame(rows), cores=2)
    assert (q["quiet_steps"], q["busy_steps"]) == (8, 2)  # steps 6 and 7
    for r in rows:
        if r["step"] == 7:
            r["step_time_s"] = 0.3
    assert quiet_summary(frame(rows), cores=2)["busy_steps"] == 1  # step 7 alone
    for r in rows:  # steps of 60 ms: steps 4-6 end within 0.2 s before step 7 ends (not step 3)
        r["step_time_s"] = 0.06
    assert quiet_summary(frame(rows), cores=2)["busy_steps"] == 4


def _covered_loads(times: list[float], loads: list[float | None]) -> list[float | None]:
    """The reference for the look-ahead, from the meter's rule (StepLoadMeter.sample): step j's
    value is measured from the newest step end (or the start) at least STEP_LOAD_WINDOW_S before
    its own end, so it covers every step k <= j that ends after that point. A step's load is
    the largest value of every step that covers it; None without its own value."""
    ends = list(itertools.accumulate(times))
    starts = [max([0.0, *(e for e in ends[:j] if e <= ends[j] - STEP_LOAD_WINDOW_S)])
              for j in range(len(ends))]  # fmt: skip
    out = []
    for k, own in enumerate(loads):
        cover = [loads[j] for j in range(k, len(ends)) if starts[j] < ends[k]]
        out.append(None if own is None else max(v for v in cover if v is not None))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_every_later_step_whose_window_reaches_back_into_a_step_covers_it(seed):
    """Random step times (20-250 ms, around the 0.2 s window) and loads, some steps without a
    value: the quiet steps are exactly those the meter's windows say were quiet."""
    rng = np.random.default_rng(seed)
    n = 40
    times = rng.uniform(0.02, 0.25, n + 2).round(4).tolist()
    loads = [float(v) for v in rng.choice([0.1, 0.3, 0.5, 0.7, 1.5], n + 2, p=[.5, .2, .1, .1, .1])]  # fmt: skip
    loads = [None if rng.random() < 0.1 else v for v in loads]
    rows = step_rows(n, 0)
    for r in rows:
        r["step_time_s"] = times[r["step"]]
        r["other_cpu_cores"] = loads[r["step"]] if r["rank"] == 0 else None
    expected = _covered_loads(times, loads)
    quiet = {k for k in range(2, n + 2) if expected[k] is not None and expected[k] <= 0.5}
    busy = {k for k in range(2, n + 2) if expected[k] is not None and expected[k] > 0.5}
    assert quiet and busy, "a draw without both kinds of step would prove little"
    q = quiet_summary(frame(rows), cores=2)
    assert (q["quiet_steps"], q["busy_steps"]) == (len(quiet), len(busy))
    steps = frame(rows)["step"][q["mask"]] if q["throughput_basis"] == "quiet" else None
    if steps is not None:
        assert set(steps) == quiet
    naive = {k for k in range(2, n + 2) if loads[k] is not None and loads[k] <= 0.5}
    assert quiet <= naive  # look-ahead only removes steps


def test_a_run_without_per_step_load_is_neither_quiet_nor_busy():
    rows = [{k: v for k, v in r.items() if k != "other_cpu_cores"} for r in step_rows(10, 0)]
    q = quiet_summary(pd.DataFrame(rows), cores=2)
    assert q["quiet_steps"] is None and q["busy_steps"] is None
    assert q["throughput_basis"] == "all" and q["host_contention_frac"] is None


def record(mode: str, world: int, sps: float, **env) -> dict:
    return {"schema_version": 2, "run_id": f"{mode}-x", "status": "ok",
            "config": {"mode": mode, "backend": "gloo" if mode == "ddp" else "none",
                       "world_size": world, "nproc_per_node": world, "model": "mlp",
                       "dataset": "synthetic", "scaling": "strong", "global_batch": 64,
                       "per_device_batch": 64 // world, "seed": 0, "amp": "none",
                       "devices": ["cpu"] * world},
            "env": {"os": "Linux", "cpu_cores": 2, "threads_per_rank": 2 // world, **env},
            "metrics": {"samples_per_s": sps}}  # fmt: skip


def test_cores_in_use_from_the_record(tmp_path):
    def cores(rec: dict) -> int | None:
        write_run_json(tmp_path, rec)
        return cores_in_use(read_record(tmp_path / "run.json")[0])

    assert cores(record("single", 1, 1.0)) == 2  # 1 rank × 2 threads
    assert cores(record("ddp", 2, 1.0)) == 2  # 2 ranks × 1 thread
    assert cores(record("ddp", 2, 1.0, threads_per_rank=4)) == 2  # at most the host's cores
    assert cores(record("single", 1, 1.0, threads_per_rank=None)) == 2  # unknown: every core
    assert cores(record("single", 1, 1.0, threads_per_rank=1, cpu_cores=None)) is None


def write_run(run_dir: Path, mode: str, world: int, quiet: int, busy: int) -> Path:
    rows = step_rows(quiet, busy, world=world)
    write_steps_csv(run_dir, rows)
    sps = 64 * (quiet + busy) / (quiet * QUIET_S + busy * BUSY_S)  # as the trainer computes it
    write_run_json(run_dir, {**record(mode, world, sps), "run_id": run_dir.name})
    return run_dir


def test_the_headline_of_a_folder_is_its_quiet_figure(tmp_path):
    half = write_run(tmp_path / "half", "single", 1, 10, 10)
    assert run_headline(half) == pytest.approx(640.0)  # not run.json's 320
    few = write_run(tmp_path / "few", "single", 1, 5, 10)
    assert run_headline(few) == pytest.approx(64 * 15 / 3.5)  # run.json's all-steps figure


def test_runs_json_uses_quiet_figures_and_phases(tmp_path):
    write_run(tmp_path / "runs" / "single", "single", 1, 10, 10)
    write_run(tmp_path / "runs" / "ddp", "ddp", 2, 12, 2)
    data = compare_runs([tmp_path / "runs"], progress=False, traces=False)
    runs = {r["run_id"]: r for r in data["runs"]}
    single, ddp = runs["single"], runs["ddp"]
    assert single["samples_per_s_all"] == pytest.approx(320.0)
    assert single["samples_per_s"] == single["samples_per_s_quiet"] == pytest.approx(640.0)
    assert (single["quiet_steps"], single["busy_steps"]) == (10, 10)
    assert single["throughput_basis"] == "quiet" and not single["throughput_noisy"]
    assert single["phases_s"]["forward"] == pytest.approx(0.4 * QUIET_S)  # quiet steps only
    assert ddp["speedup"] == pytest.approx(1.0)  # 640 vs 640: both on their quiet steps
    (g,) = [g for g in data["groups"] if g["mode"] == "ddp"]
    assert g["throughput_basis"] == "quiet" and g["busy_run_ids"] == ["ddp", "single"]
    assert g["noisy_run_ids"] == []
    text = "".join(s["text"] for s in verdict(data)[0]["segments"])
    assert text.startswith("DDP (gloo), 2 ranks: 1.00× over single device on quiet steps (")


def test_the_verdict_quotes_no_number_it_knows_is_noise(tmp_path):
    write_run(tmp_path / "runs" / "single", "single", 1, 10, 10)
    write_run(tmp_path / "runs" / "ddp", "ddp", 2, 4, 10)  # 4 quiet steps: all-steps figure
    data = compare_runs([tmp_path / "runs"], progress=False, traces=False)
    (g,) = [g for g in data["groups"] if g["mode"] == "ddp"]
    assert g["noisy_run_ids"] == ["ddp"] and g["throughput_basis"] == "mixed"
    (v,) = verdict(data)
    text = "".join(s["text"] for s in v["segments"])
    assert text.startswith(f"DDP (gloo), 2 ranks: {NOT_ENOUGH_QUIET}.")
    assert (
        NOT_ENOUGH_QUIET
        == "not enough quiet steps: re-run with --repeat auto or on an idle machine"
    )
    assert "×" not in text and "%" not in text  # neither the speedup nor the efficiency


def test_steps_csv_other_cpu_cores_is_optional_and_checked(tmp_path):
    rows = step_rows(3, 0)
    write_steps_csv(tmp_path, rows)
    steps = read_steps_frame(tmp_path / "steps.csv")
    assert steps["other_cpu_cores"].iloc[0] == 0.2 and pd.isna(steps["other_cpu_cores"].iloc[1])
    old = tmp_path / "old.csv"  # a run from before the column
    pd.DataFrame(rows).drop(columns="other_cpu_cores").to_csv(old, index=False)
    assert "other_cpu_cores" not in read_steps_frame(old).columns
    bad = tmp_path / "bad.csv"
    pd.DataFrame([{**rows[0], "other_cpu_cores": -0.1}]).to_csv(bad, index=False)
    with pytest.raises(InvalidRecord, match="other_cpu_cores, line 2`: negative"):
        read_steps_frame(bad)


def test_the_step_meter_does_not_count_this_process_as_other():
    """Spinning here until this process has used 0.3 s of CPU (however long a loaded machine
    takes to give it, at most 60 s): the window's `other` × wall is at most the machine's busy
    CPU less this process's (measured around the meter, so a little wider)."""
    meter = StepLoadMeter()
    me = psutil.Process()
    own0, sys0, t0 = sum(me.cpu_times()[:2]), psutil.cpu_times(), time.perf_counter()
    meter.start()
    cpu0, end = time.process_time(), time.perf_counter() + 60
    while time.process_time() - cpu0 < 0.3 and time.perf_counter() < end:
        pass
    other = meter.sample()
    wall, own, sys1 = time.perf_counter() - t0, sum(me.cpu_times()[:2]) - own0, psutil.cpu_times()
    fields = ("user", "nice", "system", "irq", "softirq")
    busy = sum(getattr(sys1, f) - getattr(sys0, f) for f in fields)
    assert own > 0.05, "the spin got almost no CPU: the check below would prove nothing"
    assert other is not None and other * wall <= busy - own + 0.05


@pytest.mark.integration
def test_the_step_meter_counts_a_child_started_in_the_window_as_the_runs_own():
    """A process the run starts after the meter did (a DataLoader worker) is the run's from its
    first tick, once the tree is listed again (`relist`, as at a new epoch)."""
    meter = StepLoadMeter()
    meter.start()
    # The child spins until it has used 0.3 s of CPU, says so, then idles: what the meter reads
    # and what is read after it are the same count, however slowly a loaded machine runs it.
    spin = "import time\nwhile time.process_time() < 0.3: pass\nprint('spun', flush=True)\n"
    spin += "time.sleep(120)"
    child = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "spun"
        own0 = meter.own.total_s
        meter.sample(relist=True)
        used = sum(psutil.Process(child.pid).cpu_times()[:2])
    finally:
        child.kill()
        child.wait(timeout=60)
        child.stdout.close()
    assert used > 0.05, "the child got almost no CPU: the check below would prove nothing"
    assert meter.own.total_s - own0 >= used - 0.02  # all of it, from 0 (10 ms ticks)


def test_a_noisy_verdict_keeps_the_familys_exact_memory_but_not_its_throughput(tmp_path):
    """The memory a sharded mode saves is counted, not timed: the family line stays in a verdict
    whose throughput is noise, without its "% of DDP's throughput"."""
    write_run(tmp_path / "runs" / "single", "single", 1, 10, 10)
    write_run(tmp_path / "runs" / "ddp", "ddp", 2, 4, 10)
    data = compare_runs([tmp_path / "runs"], progress=False, traces=False)
    (g,) = [g for g in data["groups"] if g["mode"] == "ddp"]
    member = {"label": "FSDP2", "saved_bytes": 5 * 2**20, "saved_pct": 38.0,
              "throughput_vs_ddp_pct": 51.0}  # fmt: skip
    data["family"] = [{**{k: g[k] for k in WORKLOAD_KEY}, "backend": "gloo", "world_size": 2,
                       "members": [member], "capacity": [], "budget_bytes": None}]  # fmt: skip
    text = "".join(s["text"] for s in verdict(data)[0]["segments"])
    assert text.startswith(f"DDP (gloo), 2 ranks: {NOT_ENOUGH_QUIET}.")
    assert "FSDP2 saves 5.00 MiB per rank (38%) (gloo, 2 ranks)." in text
    assert "throughput" not in text


@pytest.mark.parametrize("bad", [np.inf, 1e308, np.nan, -1.0])
def test_a_damaged_step_time_leaves_the_quiet_rule_standing(bad):
    """A steps.csv time that is infinite, past timedelta's range, missing or negative is read
    on a clamped clock: the quiet steps are still counted, no exception."""
    rows = step_rows(10, 0)
    for r in rows:
        if r["step"] == 5:
            r["step_time_s"] = bad
    q = quiet_summary(frame(rows), cores=2)
    assert q["quiet_steps"] == 10 and q["busy_steps"] == 0
