"""Issue 9: the collective benchmark (real torchrun, gloo) and the scaling projection.

References: the α–β fit and the replay against hand-built exact cases; DDP's bucket assignment
against torch's own `_compute_bucket_assignment_by_size` and against a real DDP run's reducer.
No timing is asserted: measured errors are printed by `make bench-projection`.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.cli.main import main as analysis_main
from analysis.project.comm import (
    COMM_COLUMNS,
    collective_time_us,
    fit_alpha_beta,
    with_measured_curve,
)
from analysis.project.model import ddp_buckets, expected_max
from analysis.project.projection import project, unprofiled_steps
from analysis.project.step import bucket_timeline
from analysis.runs.entry import load_run
from analysis.trace.collectives import bus_factor
from profiler.runfolder.layout import NO_UNPROFILED_STEP_WARNING
from profiler.runfolder.schema import Config, ProfileSettings
from profiler.runfolder.versions import RUN_JSON_SCHEMA_VERSION
from tests.conftest import read_run

COLLECTIVES = {
    "all_reduce",
    "broadcast",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
}


def test_bench_comm_writes_a_checked_comm_run(fresh_golden):
    comm_run = fresh_golden("comm-gloo")  # made now by bench-comm, as `make golden` makes it
    rec = read_run(comm_run)
    assert rec["kind"] == "comm" and rec["status"] == "ok"
    with open(comm_run / "comm.csv", newline="") as f:
        assert next(csv.reader(f)) == COMM_COLUMNS  # exactly these columns, in this order
    rows = pd.read_csv(comm_run / "comm.csv")
    skipped = {s["collective"] for s in rec["metrics"]["skipped"]}
    assert set(rows["collective"]) | skipped == COLLECTIVES  # each one measured or skipped
    assert all(s["reason"] for s in rec["metrics"]["skipped"])
    assert all(rec["metrics"]["checks"][c] == "ok" for c in set(rows["collective"]))
    assert (rows["backend"] == "gloo").all() and (rows["world_size"] == 2).all()
    assert (rows["iters"] == 3).all() and (rows["time_us_p95"] >= rows["time_us_median"]).all()
    # 4 B is one float: it cannot split over 2 ranks, so only all_reduce/broadcast run it.
    assert set(rows[rows["bytes"] == 4]["collective"]) <= {"all_reduce", "broadcast"}
    algbw = rows["bytes"] / rows["time_us_median"] / 1e3
    assert np.allclose(rows["algbw_gbps"], algbw)
    factors = rows["collective"].map(lambda c: bus_factor(c, 2))
    assert np.allclose(rows["busbw_gbps"], rows["algbw_gbps"] * factors)
    models = rec["metrics"]["comm_model"]
    for name in set(rows["collective"]):
        m = models[name]
        assert m["alpha_us"] >= 0 and m["bus_gbps"] > 0 and m["fit_error_pct_mean"] >= 0
    assert "α–β fit" in (comm_run / "logs" / "table.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--nproc", "0"], "--nproc must be >= 1"),
        (["--sizes", "1 kib"], "--sizes must be byte counts"),
        (["--backend", "nccl", "--device", "cpu"], "--backend nccl needs CUDA"),
    ],
)
def test_bench_comm_bad_input_is_one_line(tmp_path, capsys, args, match):
    from workloads.comm import bench as bench_comm

    assert bench_comm.main(["--runs-dir", str(tmp_path), *args]) == 2  # refused before torchrun
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and match in lines[0] and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # refused before any run folder exists


def test_alpha_beta_fit_recovers_an_exact_model():
    sizes = np.array([4, 1024, 65536, 1 << 20, 1 << 24], dtype=float)
    for name, n in (("all_reduce", 4), ("all_gather_into_tensor", 8), ("broadcast", 2)):
        truth = {"collective": name, "alpha_us": 7.0, "bus_gbps": 12.0}
        times = [collective_time_us(truth, s, n) for s in sizes]
        fit = fit_alpha_beta(name, n, sizes, np.array(times))
        assert fit["alpha_us"] == pytest.approx(7.0, rel=1e-6)
        assert fit["bus_gbps"] == pytest.approx(12.0, rel=1e-6)
        assert fit["fit_error_pct_max"] < 1e-6
    # hand-computed: ring all_reduce over 4 ranks, 1 MB at 10 GB/s bus, α = 5 µs
    model = {"collective": "all_reduce", "alpha_us": 5.0, "bus_gbps": 10.0}
    assert collective_time_us(model, 1e6, 4) == pytest.approx(6 * 5 + 1.5 * 100)
    assert collective_time_us(model, 1e6, 1) == 0.0


def test_measured_curve_gives_the_benchmark_back():
    """gloo jumps ~10x in time between 1 and 2 MiB (seen on this machine): one (α, B) pair cannot
    follow that, the per-size bandwidth must give every benchmarked median back at its own n."""
    sizes, times = [1024, 1 << 20, 1 << 21, 1 << 22], [100.0, 500.0, 5000.0, 10000.0]
    fit = fit_alpha_beta("all_reduce", 2, sizes, times)
    assert fit["fit_error_pct_max"] > 20  # the single fit is off somewhere
    model = with_measured_curve(fit, sizes, times)
    assert [collective_time_us(model, s, 2) for s in sizes] == pytest.approx(times)
    assert 5000 < collective_time_us(model, 3e6, 2) < 10000  # between its neighbours
    # other n: ring formulas, 2(n−1) latency steps and 2(n−1)/n of the bytes
    bw = 1 / (model["curve"]["bus_gbps"][-1] * 1e3)
    want = 6 * fit["alpha_us"] + 1.5 * (1 << 22) * bw
    assert collective_time_us(model, 1 << 22, 4) == pytest.approx(want)


def test_ddp_buckets_match_torch_and_the_real_reducer(ddp_mlp_run):
    import torch.distributed as dist

    from workloads.train.models import build_model

    for name in ("resnet18", "mlp", "smallcnn"):
        params = [p for p in build_model(name, num_classes=10).parameters() if p.requires_grad]
        for cap_mb in (25.0, 1.0, 0.5):
            ready = params[::-1]  # gradients become ready in reverse order
            limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, int(cap_mb * 2**20)]
            idx, _ = dist._compute_bucket_assignment_by_size(ready, limits, [False] * len(ready))
            want = [sum(ready[i].numel() * 4 for i in b) for b in idx]
            assert ddp_buckets([p.numel() * 4 for p in params], cap_mb) == want
    record = read_run(ddp_mlp_run)
    metrics, first = record["metrics"], record["config"]["ddp"]["first_bucket_bytes"]
    want = metrics["ddp"]["bucket_sizes_bytes"]
    assert ddp_buckets(metrics["param_grad_bytes"], 25.0, first) == want


def test_bucket_simulation_by_hand():
    def end(line):
        return line[-1][0] + line[-1][2]

    # bucket 1 ready at 1 s runs 0.5 s; bucket 2 ready at 2 s waits for nothing, runs 3 s -> 5 s
    assert end(bucket_timeline([1.0, 2.0], [0.5, 3.0])) == pytest.approx(5.0)
    # bucket 2 ready at 1.2 s must wait for bucket 1 (ends at 1.5 s) -> 1.5 + 3
    assert end(bucket_timeline([1.0, 1.2], [0.5, 3.0])) == pytest.approx(4.5)


def test_expected_max_by_hand():
    # two equally likely values 1 and 2: max of two draws is 1 only when both are 1 (1/4)
    assert expected_max(np.array([2.0, 1.0]), 2) == pytest.approx(1 * 0.25 + 2 * 0.75)
    assert expected_max(np.array([2.0, 1.0]), 1) == pytest.approx(1.5)
    assert expected_max(np.full(7, 3.0), 64) == pytest.approx(3.0)  # no spread, no wait


def test_every_step_profiled_falls_back_with_the_one_warning(tmp_path, comm_run, single_mlp_run):
    """The run-folder rule's fallback (profiler.runfolder.layout.throughput_steps): no unprofiled
    measured step, so the projection measures every measured step and says so, in the same words
    run.json and the runs JSON use."""
    profiled = tmp_path / "profiled"
    shutil.copytree(single_mlp_run, profiled, ignore=shutil.ignore_patterns("traces"))
    steps = pd.read_csv(profiled / "steps.csv").assign(profiled=1)
    steps.to_csv(profiled / "steps.csv", index=False)
    out = project(profiled, comm_run, [1, 2], traces=False)
    assert NO_UNPROFILED_STEP_WARNING in out["warnings"]
    measured = steps[steps["warmup"] == 0]
    assert out["inputs"]["steps_used"] == measured["step"].nunique()
    assert out["inputs"]["measured_step_time_s"] == pytest.approx(measured["step_time_s"].mean())
    assert NO_UNPROFILED_STEP_WARNING in load_run(profiled).warnings


def test_unprofiled_steps_from_schedule_and_column():
    steps = pd.DataFrame({"step": range(8), "warmup": [1, 1, 0, 0, 0, 0, 0, 0]})
    profile = ProfileSettings(enabled=True, wait=1, warmup=1, active=3, repeat=1)
    config = Config(mode="single", world_size=1, profile=profile)
    assert list(unprofiled_steps(steps, config)["step"]) == [5, 6, 7]  # 1..4: profiler on
    profile.repeat = 0  # cycles until the end: 6, 7 are the next cycle's on-steps
    assert list(unprofiled_steps(steps, config)["step"]) == [5]
    with_column = steps.assign(profiled=[0, 0, 1, 0, 0, 1, 1, 0])  # the column wins when present
    assert list(unprofiled_steps(with_column, config)["step"]) == [3, 4, 7]


def fake_run(
    path: Path, *, mode: str, n: int, phases: dict, buckets: list[int], metrics=None, **cfg
) -> Path:
    """A hand-built training run folder: 10 steps, none profiled, fixed phase times."""
    path.mkdir(parents=True)
    batch = cfg.get("per_device_batch", 32)
    rows = []
    for step in range(10):
        for rank in range(n):
            rows.append(
                {
                    "rank": rank,
                    "step": step,
                    "warmup": int(step < 2),
                    "step_time_s": sum(phases.values()),
                    **{f"{k}_s": v for k, v in phases.items()},
                }
            )
    pd.DataFrame(rows).to_csv(path / "steps.csv", index=False)
    rec = {
        "schema_version": RUN_JSON_SCHEMA_VERSION,  # the projection reads it typed, as all do
        "run_id": path.name,
        "status": "ok",
        "config": {
            "mode": mode,
            "backend": "gloo" if mode == "ddp" else "none",
            "world_size": n,
            "per_device_batch": batch,
            "global_batch": batch * n,
            "scaling": "weak",
            "ddp": {"bucket_cap_mb": 25.0, "comm_hook": "none"},
            "profile": {"enabled": False},
            **cfg,
        },
        "env": {"threads_per_rank": 1},
        "metrics": {
            "ddp": {"bucket_sizes_bytes": buckets},
            "param_grad_bytes": buckets,
            **(metrics or {}),
        },
    }
    (path / "run.json").write_text(json.dumps(rec))
    return path


def fake_comm(
    path: Path,
    *,
    alpha_us: float,
    bus_gbps: float,
    backend: str = "gloo",
    collectives: tuple[str, ...] = ("all_reduce",),
    mean_factor: float | None = None,
    back_to_back: float | None = None,
    config: dict | None = None,
) -> Path:
    """A hand-built comm run whose medians follow an exact α–β model; with `mean_factor`, run.json
    also holds mean times = mean_factor × the medians (as bench_comm writes them)."""
    path.mkdir(parents=True)
    rows, means = [], []
    for name in collectives:
        model = {"collective": name, "alpha_us": alpha_us, "bus_gbps": bus_gbps}
        for nbytes in (1024, 65536, 1 << 20, 1 << 22):
            t = collective_time_us(model, nbytes, 2)
            algbw = nbytes / t / 1e3
            rows.append(
                dict(
                    collective=name, backend=backend, world_size=2, bytes=nbytes, iters=5,
                    time_us_median=t, time_us_p95=t, algbw_gbps=algbw, busbw_gbps=algbw,
                )
            )  # fmt: skip
            if mean_factor:
                means.append({"collective": name, "bytes": nbytes, "time_us_mean": t * mean_factor})
                if back_to_back:
                    means[-1]["time_us_mean_back_to_back"] = t * back_to_back
    pd.DataFrame(rows, columns=COMM_COLUMNS).to_csv(path / "comm.csv", index=False)
    rec = {
        "kind": "comm",
        "run_id": path.name,
        "status": "ok",
        "config": {"backend": backend, "world_size": 2, **(config or {})},
        "metrics": {"time_us_mean": means} if means else {},
    }
    (path / "run.json").write_text(json.dumps(rec))
    return path


def test_replay_of_an_exact_ddp_run_is_exact(tmp_path):
    """A DDP run whose backward = compute + exactly the modelled all-reduce of its one bucket
    (ready when backward ends): the replay must give its step time back, and a weak-scaling
    single-device run with that compute must project the same step at n = 2."""
    comm = fake_comm(tmp_path / "comm", alpha_us=50.0, bus_gbps=2.0)
    bucket = 3_000_000
    ar_s = collective_time_us(
        {"collective": "all_reduce", "alpha_us": 50, "bus_gbps": 2}, bucket, 2
    )
    ar_s /= 1e6
    compute = {"data": 0.001, "forward": 0.004, "backward": 0.008, "optimizer": 0.002}
    ddp_phases = dict(compute, backward=compute["backward"] + ar_s)
    ddp = fake_run(tmp_path / "ddp", mode="ddp", n=2, phases=ddp_phases, buckets=[bucket])
    single = fake_run(tmp_path / "single", mode="single", n=1, phases=compute, buckets=[bucket])
    # traced (profiled) steps run 1.5x slower: the exposed share of the step is what carries over
    traced = {
        "exposed_comm_us": 1.5 * ar_s * 1e6,
        "step_time_us_mean": 1.5 * sum(ddp_phases.values()) * 1e6,
    }
    trace = {"ranks": [traced, traced]}
    out = project(ddp, comm, [1, 2, 4], traces=trace)
    assert out["replay"]["error_pct"] == pytest.approx(0.0, abs=1e-6)
    by_n = {p["ranks"]: p for p in out["predictions"]}
    assert by_n[1]["comm_s"] == 0 and by_n[1]["scaling_efficiency"] == pytest.approx(1.0)
    assert by_n[2]["exposed_comm_s"] == pytest.approx(ar_s)
    assert by_n[4]["comm_s"] > by_n[2]["comm_s"]  # 2(n−1) steps and 2(n−1)/n of the bytes
    weak = project(single, comm, [2], measured=[ddp], traces=False)
    assert weak["measured"][0]["error_pct"] == pytest.approx(0.0, abs=1e-6)
    for p in out["predictions"]:
        assert p["samples_per_s"] == pytest.approx(p["global_batch"] / p["step_time_s"])
        assert p["speedup"] == pytest.approx(p["scaling_efficiency"] * p["ranks"])
    big = project(single, comm, [2], wire_bytes_factor=2.0)  # 6 MB on the wire > 4 MiB measured
    assert any("extrapolated" in w for w in big["warnings"])


def test_project_real_ddp_run_prints_replay_error(ddp_mlp_run, comm_run, tmp_path, capsys):
    out_json = tmp_path / "p.json"
    args = [str(ddp_mlp_run), "--comm", str(comm_run), "--ranks", "1,2,8,64", "--json"]
    assert analysis_main(["project", *args, str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "replay at n=2: measured" in text and "error" in text
    result = json.loads(out_json.read_text())
    assert result["ranks"] == [1, 2, 8, 64] and result["inputs"]["buckets_bytes"]
    fields = {"step_time_s", "compute_s", "comm_s", "exposed_comm_s", "samples_per_s"}
    for p in result["predictions"]:
        assert fields | {"speedup", "scaling_efficiency", "ranks"} <= set(p)
        assert p["step_time_s"] == pytest.approx(
            p["compute_s"] + p["straggler_s"] + p["exposed_comm_s"]
        )
        assert 0 <= p["exposed_comm_s"] <= p["comm_s"] + 1e-12
    assert result["replay"]["ranks"] == 2 and np.isfinite(result["replay"]["error_pct"])
    assert result["inputs"]["traced_exposed_comm_s"] is not None  # taken out of backward
    assert result["assumptions"]


def error_line(argv: list[str], capsys) -> str:
    assert analysis_main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
