"""env.host_load (issue 26): a real run measured while busy child processes load every core
records the load, and the report flags it; the speedup finding says when either side was busy."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from analysis.report.findings import THRESHOLDS, findings
from analysis.runs.compare import compare_runs
from tests.conftest import launch, read_run

# serial: it asserts the load its own busy processes put on the machine.
pytestmark = pytest.mark.serial

RUN = "--mode single --model mlp --dataset synthetic --max-steps 30 --batch-size 32 --epochs 1"
RUN += " --no-profile --device cpu --threads 1 --run-id busy"


def _spinners(n: int) -> list[subprocess.Popen]:
    """n processes that keep one core each busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


@pytest.mark.integration
def test_a_run_beside_busy_processes_records_and_flags_the_load(tmp_path):
    cores = psutil.cpu_count() or 1
    spin = _spinners(cores)
    try:
        procs = [psutil.Process(p.pid) for p in spin]
        cpu0, t0 = sum(sum(p.cpu_times()[:2]) for p in procs), time.perf_counter()
        launch([*RUN.split(), "--runs-dir", str(tmp_path)])
        spin_cores = (sum(sum(p.cpu_times()[:2]) for p in procs) - cpu0) / (
            time.perf_counter() - t0
        )
    finally:
        for p in spin:
            p.kill()
            p.wait()
    load = read_run(tmp_path / "busy")["env"]["host_load"]
    assert set(load) == {"load_avg_1m_start", "load_avg_1m_end", "other_cpu_cores_mean",
                         "steal_pct", "cores", "own_threads"}  # fmt: skip
    assert load["cores"] == cores and load["own_threads"] >= 1
    assert load["load_avg_1m_start"] >= 0 and load["load_avg_1m_end"] >= 0
    # the spinners are other processes: at least most of what they used is counted (the run's
    # measured window is a part of the time they ran over), and no more than the machine has
    assert 0.7 * spin_cores <= load["other_cpu_cores_mean"] <= cores + 0.05
    assert load["steal_pct"] is None or 0 <= load["steal_pct"] <= 100
    if load["other_cpu_cores_mean"] <= THRESHOLDS["busy_other_cores_frac"] * cores:
        pytest.fail(f"{cores} spinners should make the run busy; got {load}")
    data = compare_runs([tmp_path], progress=False, traces=False)
    (busy,) = [f for f in findings(data) if f.rule == "busy_machine"]
    assert busy.run_ids == ["busy"] and f"of {cores} cores" in busy.text
    assert "throughput unreliable" in busy.text


def test_the_meters_own_process_is_not_counted_as_other():
    """CPU the run's own process uses is subtracted: spinning in it until it has used 1 s of
    CPU (however long a loaded machine takes, at most 60 s) leaves
    other × wall at most the machine's busy CPU seconds minus this process's (measured around
    the meter, so a little wider); without the subtraction it would exceed that by `own`."""
    from profiler.runfolder.hostload import HostLoadMeter

    meter = HostLoadMeter()
    own0, sys0 = sum(os.times()[:2]), psutil.cpu_times()
    t0 = time.perf_counter()
    meter.start()
    cpu0, end = time.process_time(), time.perf_counter() + 60
    while time.process_time() - cpu0 < 1.0 and time.perf_counter() < end:
        pass
    load = meter.stop()
    wall = time.perf_counter() - t0
    sys1, own = psutil.cpu_times(), sum(os.times()[:2]) - own0
    fields = ("user", "nice", "system", "irq", "softirq")
    busy = sum(getattr(sys1, f) - getattr(sys0, f) for f in fields)
    assert own > 0.15, "the spin got almost no CPU: the check below would prove nothing"
    assert load.other_cpu_cores_mean * wall <= busy - own + 0.05


def _runs(single_load: float, ddp_load: float) -> dict:
    def run(rid: str, mode: str, n: int, sps: float, other: float) -> dict:
        return {"run_id": rid, "status": "ok", "mode": mode, "backend": "gloo", "world_size": n,
                "samples_per_s": sps, "baseline_run_id": "s0" if mode == "ddp" else None,
                "exposed_comm_pct": None,
                "host_load": {"other_cpu_cores_mean": other, "cores": 2}}  # fmt: skip

    runs = [run("s0", "single", 1, 100.0, single_load), run("d0", "ddp", 2, 180.0, ddp_load)]
    group = {"mode": "ddp", "backend": "gloo", "world_size": 2, "run_ids": ["d0"], "n_runs": 1,
             "speedup_mean": 1.8, "scaling_efficiency_mean": 0.9}  # fmt: skip
    return {"runs": runs, "groups": [group]}


def test_the_speedup_finding_says_when_either_side_was_busy():
    limit = THRESHOLDS["busy_other_cores_frac"] * 2  # 1.0 of 2 cores
    quiet = [f for f in findings(_runs(0.2, 0.2)) if f.rule == "scaling"][0]
    assert "busy machine" not in quiet.text and quiet.severity == "good"
    for single, ddp, who in ((limit + 0.6, 0.2, "s0"), (0.2, limit + 0.1, "d0")):
        fs = findings(_runs(single, ddp))
        (scaling,) = [f for f in fs if f.rule == "scaling"]
        assert "Measured on a busy machine" in scaling.text and who in scaling.text
        assert scaling.severity == "warn"
        assert [f.run_ids for f in fs if f.rule == "busy_machine"] == [[who]]
    at_limit = findings(_runs(limit, limit))  # "more than" the share: exactly at it is not busy
    assert not [f for f in at_limit if f.rule == "busy_machine"]


def test_seed_spread_finding_and_group_range(tmp_path):
    group = {"mode": "single", "backend": None, "world_size": 1, "run_ids": ["a", "b"],
             "n_runs": 2, "samples_per_s_min": 214.0, "samples_per_s_max": 258.0,
             "samples_per_s_spread_pct": 100 * 44 / 236}  # fmt: skip
    (f,) = [f for f in findings({"runs": [], "groups": [group]}) if f.rule == "seed_spread"]
    assert "214.0–258.0 samples/s" in f.text and "19%" in f.text
    assert f"over {THRESHOLDS['seed_spread_pct']:.0f}%" in f.text
    from analysis.runs.compare import spread

    assert spread([214.0, 258.0]) == {"samples_per_s_min": 214.0, "samples_per_s_max": 258.0,
                                       "samples_per_s_spread_pct": pytest.approx(100 * 44 / 236)}  # fmt: skip
    assert spread([200.0])["samples_per_s_spread_pct"] is None
