"""The projection on real runs: comm runs beside training runs, bench-comm's gap sweep and
collectives, threads and batch inputs, damaged fields, and the report's projection section."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from analysis.project.comm import (
    collective_time_us,
)
from analysis.project.projection import project
from analysis.runs.compare import compare_runs
from tests.conftest import REPO, read_run
from tests.test_project import (  # noqa: F401
    COLLECTIVES,
    error_line,
    fake_comm,
    fake_run,
)
from tests.test_project import test_bench_comm_bad_input_is_one_line as _bench_comm_bad_input


def test_project_bad_input_is_one_line(tmp_path, comm_run, single_mlp_run, capsys):
    nccl = fake_comm(tmp_path / "nccl", alpha_us=5, bus_gbps=50, backend="nccl")
    run = ["project", str(single_mlp_run), "--comm"]
    line = error_line([*run, str(nccl), "--backend", "gloo"], capsys)
    assert "benchmarks nccl, not the gloo asked for" in line
    assert "must be >= 1" in error_line([*run, str(comm_run), "--ranks", "2,0"], capsys)
    line = error_line(["project", str(comm_run), "--comm", str(comm_run)], capsys)
    assert "not a training run" in line
    warm = tmp_path / "warm"
    shutil.copytree(single_mlp_run, warm, ignore=shutil.ignore_patterns("traces"))
    steps = pd.read_csv(warm / "steps.csv").assign(warmup=1)
    steps.to_csv(warm / "steps.csv", index=False)
    line = error_line(["project", str(warm), "--comm", str(comm_run)], capsys)
    assert "has no measured step" in line
    one = fake_comm(tmp_path / "one-rank", alpha_us=5, bus_gbps=50)
    rec = json.loads((one / "run.json").read_text())
    (one / "run.json").write_text(
        json.dumps({**rec, "config": {"backend": "gloo", "world_size": 1}})
    )
    # run.json and comm.csv must agree on the world size (the reader checks it)
    assert "but run.json config.world_size is 1" in error_line([*run, str(one)], capsys)
    pd.read_csv(one / "comm.csv").assign(world_size=1).to_csv(one / "comm.csv", index=False)
    assert "nothing was transferred" in error_line([*run, str(one)], capsys)
    line = error_line([*run, str(comm_run), "--inter-node", "fast"], capsys)
    assert "--inter-node" in line


def test_comm_runs_are_not_training_runs_and_reach_the_report(
    tmp_path, comm_run, single_mlp_run, ddp_mlp_run
):
    from analysis.report.build import write_report

    for d in (comm_run, single_mlp_run, ddp_mlp_run):
        shutil.copytree(d, tmp_path / "runs" / d.name)
    data = compare_runs([tmp_path / "runs"], progress=False, traces=False)
    assert {r["run_id"] for r in data["runs"]} == {"single-mlp", "ddp-gloo-mlp"}
    assert [c["run_id"] for c in data["comm"]] == ["comm-gloo"]
    (proj,) = data["projections"]
    assert proj["run_id"] == "single-mlp" and proj["measured"][0]["run_id"] == "ddp-gloo-mlp"
    assert [r["run_id"] for r in proj["replays"]] == ["ddp-gloo-mlp"]
    files = write_report(data, tmp_path / "report", progress=False)
    html = files.index_html.read_text(encoding="utf-8")
    assert 'id="projection"' in html and 'id="figure-projection"' in html
    assert 'id="figure-busbw"' in html and "replay of ddp-gloo-mlp at n=2" in html


def test_threads_reach_torch_and_train_argv():
    import torch

    from workloads.config import TrainConfig, to_argv
    from workloads.plan import Environment, plan
    from workloads.train.context import RunContext
    from workloads.train.loop import build_parser, set_threads

    before = torch.get_num_threads()
    cpu = torch.device("cpu")
    one = plan(TrainConfig(threads=1, device="cpu"), Environment.detect())  # --threads 1 wins
    ctx = RunContext(
        mode="single", rank=0, local_rank=0, world_size=1, local_world_size=1,
        device=cpu, devices=(cpu,), plan=one,
    )  # fmt: skip
    try:
        assert set_threads(ctx) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    ns = build_parser().parse_args(to_argv(TrainConfig(threads=3)))  # launcher -> every rank
    assert ns.threads == 3
    with pytest.raises(ValueError, match="--threads must be >= 0"):
        TrainConfig(threads=-1)


def test_a_damaged_comm_run_is_one_skipped_line(tmp_path, comm_run, single_mlp_run):
    for d in (comm_run, single_mlp_run):
        shutil.copytree(d, tmp_path / d.name)
    csv_path = tmp_path / comm_run.name / "comm.csv"
    lines = csv_path.read_text().splitlines()
    lines[1] = lines[1].replace(",gloo,2,", ",gloo,two,")
    csv_path.write_text("\n".join(lines) + "\n")
    data = compare_runs([tmp_path], progress=False, traces=False)
    assert [r["run_id"] for r in data["runs"]] == ["single-mlp"] and data["comm"] == []
    (skip,) = data["projection_skipped"]
    assert "`world_size, line 2`: not a number (cell 'two')" in skip["reason"]


def test_strong_scaling_is_linear_in_batch_unless_a_run_at_that_batch_is_given(tmp_path):
    comm = fake_comm(tmp_path / "comm", alpha_us=50.0, bus_gbps=2.0)
    phases = {"data": 0.002, "forward": 0.008, "backward": 0.016, "optimizer": 0.004}
    big = fake_run(
        tmp_path / "b64", mode="single", n=1, phases=phases, buckets=[1000], per_device_batch=64
    )
    half = {"data": 0.0015, "forward": 0.005, "backward": 0.011, "optimizer": 0.004}
    small = fake_run(
        tmp_path / "b32", mode="single", n=1, phases=half, buckets=[1000], per_device_batch=32
    )
    linear = project(big, comm, [2], scaling="strong")["predictions"][0]
    assert linear["per_device_batch"] == 32 and linear["compute_source"] == "linear in batch"
    assert linear["compute_s"] == pytest.approx((0.002 + 0.008 + 0.016) / 2 + 0.004)
    measured = project(big, comm, [2], scaling="strong", batch_runs=[small])["predictions"][0]
    assert measured["compute_source"] == "measured (b32)"
    assert measured["compute_s"] == pytest.approx(sum(half.values()))
    weak = project(big, comm, [2], scaling="weak")["predictions"][0]
    assert weak["per_device_batch"] == 64 and weak["compute_s"] == pytest.approx(
        sum(phases.values())
    )


@pytest.mark.integration
def test_bench_comm_gap_sweep_and_collectives_reach_the_run(tmp_path):
    """A real run with --collectives and a gap sweep: only all_reduce is timed; the sweep times
    it after 0 and 40 ms of compute at both sizes (so the run cannot be shorter than sizes ×
    (iterations + 1 warm-up) × 40 ms), run.json holds a mean per comm.csv row, both means per
    size and gap, and the host contention at 1 and 2 busy ranks. Started as a user starts it,
    from a folder outside the repository with only PYTHONPATH naming dpscope: the run lands
    under that folder's relative --runs-dir, nothing in the repository."""
    import os
    import time

    user = tmp_path / "user folder"
    user.mkdir()
    args = "--backend gloo --nproc 2 --iters 4 --warmup 1 --run-id g --collectives all_reduce"
    t0 = time.perf_counter()
    sweep = ["--gaps-ms", "40 0", "--gap-iters", "2"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "workloads.comm.bench", *args.split(), "--sizes", "64 4096",
         *sweep, "--runs-dir", "c"],
        cwd=user, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.perf_counter() - t0 > 2 * 3 * 0.040
    assert sorted(p.name for p in user.iterdir()) == ["c"] and not (REPO / "c").exists()
    rec = read_run(user / "c" / "g")
    assert rec["status"] == "ok" and rec["metrics"]["checks"] == {"all_reduce": "ok"}
    assert rec["config"]["gaps_ms"] == [0.0, 40.0] and rec["config"]["gap_iters"] == 2
    assert rec["config"]["collectives"] == ["all_reduce"]
    rows = pd.read_csv(user / "c" / "g" / "comm.csv")
    assert set(rows["collective"]) == {"all_reduce"} and list(rows["bytes"]) == [64, 4096]
    means = rec["metrics"]["time_us_mean"]
    assert [(m["collective"], m["bytes"]) for m in means] == [
        ("all_reduce", 64),
        ("all_reduce", 4096),
    ]
    idle = rec["metrics"]["idle_penalty"]
    assert [(m["bytes"], m["gap_ms"]) for m in idle] == [(64, 0), (64, 40), (4096, 0), (4096, 40)]
    assert all(m["time_us_mean"] > 0 and m["time_us_mean_back_to_back"] > 0 for m in idle)
    assert rec["metrics"]["idle_sweep_s"] > 2 * 3 * 0.040
    host = rec["metrics"]["host_contention"]
    assert host["ranks"] == [1, 2] and host["slowdown"][0] == 1.0 and host["slowdown"][1] > 0
    assert host["windows"] == 3  # before the sizes, before the idle sweep, after it
    assert host["slowdown_min"][1] <= host["slowdown"][1] <= host["slowdown_max"][1]
    assert "idle-penalty sweep" in proc.stdout and "host contention" in proc.stdout
    assert "median of 3 windows' rounds" in proc.stdout  # and the range the band takes
    load = rec["env"]["host_load"]  # how busy the host was while it timed
    assert load["cores"] >= 1 and load["other_cpu_cores_mean"] >= 0


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--gaps-ms", "soon"], "--gaps-ms must be milliseconds"),
        (["--gaps-ms", "all_reduce=3"], "--gaps-ms must be milliseconds"),
        (["--gaps-ms", "0 -1"], "--gaps-ms must be milliseconds"),
        (["--gap-iters", "0"], "--gap-iters must be >= 1"),
        (["--collectives", "all_reduce scatter"], "--collectives must name some of"),
    ],
)
def test_bench_comm_bad_gap_or_collectives_is_one_line(tmp_path, capsys, args, match):
    _bench_comm_bad_input(tmp_path, capsys, args, match)


def test_mean_times_and_buffer_broadcasts_by_hand(tmp_path):
    """Hand-built exact case: a comm run whose means are 1.5 × its α–β medians, and a model with
    two buffer dtypes (DDP broadcasts each at every forward). The projected step at n = 2 is the
    compute + the all-reduce at the *mean* times (one bucket, ready when backward ends) + the two
    broadcasts at the mean times; at n = 1 there is no communication."""
    comm = fake_comm(
        tmp_path / "comm", alpha_us=50.0, bus_gbps=2.0, mean_factor=1.5,
        collectives=("all_reduce", "broadcast"), config={"devices": ["cpu", "cpu"]},
    )  # fmt: skip
    phases = {"data": 0.001, "forward": 0.004, "backward": 0.008, "optimizer": 0.002}
    # sizes the comm run measured: the mean curve passes through them exactly
    bucket, groups = 1 << 20, {"float32": 65536, "int64": 1024}
    run = fake_run(
        tmp_path / "single", mode="single", n=1, phases=phases, buckets=[bucket],
        metrics={"buffer_bytes_by_dtype": groups},
    )  # fmt: skip
    out = project(run, comm, [1, 2])
    ar = {"collective": "all_reduce", "alpha_us": 50.0, "bus_gbps": 2.0}
    bc = {"collective": "broadcast", "alpha_us": 50.0, "bus_gbps": 2.0}
    ar_s = 1.5 * collective_time_us(ar, bucket, 2) / 1e6
    bc_s = 1.5 * sum(collective_time_us(bc, b, 2) for b in groups.values()) / 1e6
    one, two = out["predictions"]
    assert one["comm_s"] == 0 and one["buffer_broadcast_s"] == 0
    assert two["buffer_broadcast_s"] == pytest.approx(bc_s, rel=1e-6)
    assert two["exposed_comm_s"] == pytest.approx(ar_s + bc_s, rel=1e-6)
    assert two["step_time_s"] == pytest.approx(sum(phases.values()) + ar_s + bc_s, rel=1e-6)
    assert out["inputs"]["comm_time_statistic"] == "mean"
    assert out["inputs"]["buffer_broadcasts_bytes"] == [65536, 1024]
    assert not [w for w in out["warnings"] if "COMM_GAP_MS" in w]  # one comm run serves all
    no_bcast = fake_comm(tmp_path / "ar-only", alpha_us=50.0, bus_gbps=2.0)
    out = project(run, no_bcast, [2])
    assert out["predictions"][0]["buffer_broadcast_s"] == 0
    assert out["inputs"]["comm_time_statistic"] == "median"
    assert any("buffer broadcast is left out" in w for w in out["warnings"])


def test_the_trainer_records_buffer_bytes_by_dtype(single_mlp_run):
    from profiler.modelinfo import buffer_bytes_by_dtype
    from workloads.train.models import build_model

    assert read_run(single_mlp_run)["metrics"]["buffer_bytes_by_dtype"] == {}  # no buffers
    cnn = build_model("smallcnn", num_classes=10)  # three BatchNorms: 32 + 64 + 128 channels
    assert buffer_bytes_by_dtype(cnn) == {"float32": 2 * 224 * 4, "int64": 3 * 8}


# (which run, field, damaged value, the field the line names): each a typed field since issue 25
DAMAGED_FIELDS = [
    ("comm", "gap_ms", [3], "`config.gap_ms`"),
    ("comm", "gap_ms", {"all_reduce": "soon"}, "`config.gap_ms[...]`"),
    ("comm", "gap_ms", {"all_reduce": -5}, "`config.gap_ms[...]`"),
    ("comm", "means", "fast", "`metrics.time_us_mean`"),
    ("comm", "means", [1, None], "`metrics.time_us_mean[0]`"),
    ("comm", "means", [{"collective": [1], "bytes": 1024}], "`metrics.time_us_mean[0].collective`"),
    ("run", "buffer_bytes_by_dtype", "many", "`metrics.buffer_bytes_by_dtype`"),
    ("run", "buffer_bytes_by_dtype", {"x": "y"}, "`metrics.buffer_bytes_by_dtype[...]`"),
    ("run", "memory_breakdown", {"buffers_bytes": 10}, "`metrics.memory_breakdown`"),
    ("run", "memory_breakdown", [3], "`metrics.memory_breakdown[0]`"),
]


@pytest.mark.parametrize(("which", "field", "value", "named"), DAMAGED_FIELDS)
def test_damaged_new_fields_are_one_invalid_line(tmp_path, capsys, which, field, value, named):
    """Wrong-typed comm `config.gap_ms` / `metrics.time_us_mean` and training
    `metrics.buffer_bytes_by_dtype` / `memory_breakdown` are read through the typed records:
    `analysis project` refuses with one line naming the file and the field (never a traceback
    or a silently different projection); the clean pair still projects."""
    config = {"devices": ["cpu", "cpu"], "gap_ms": value if field == "gap_ms" else {}}
    comm = fake_comm(
        tmp_path / "comm", alpha_us=50.0, bus_gbps=2.0, collectives=("all_reduce", "broadcast"),
        config=config,
    )  # fmt: skip
    if field == "means":
        rec = json.loads((comm / "run.json").read_text())
        rec["metrics"] = {"time_us_mean": value}
        (comm / "run.json").write_text(json.dumps(rec))
    phases = {"data": 0.001, "forward": 0.004, "backward": 0.008, "optimizer": 0.002}
    metrics = {field: value} if which == "run" else {}
    run = fake_run(
        tmp_path / "s", mode="single", n=1, phases=phases, buckets=[1 << 20], metrics=metrics
    )
    line = error_line(["project", str(run), "--comm", str(comm)], capsys)
    assert named in line and "run.json" in line and "Traceback" not in line
    clean = fake_run(tmp_path / "c", mode="single", n=1, phases=phases, buckets=[1 << 20])
    good = fake_comm(tmp_path / "good", alpha_us=50.0, bus_gbps=2.0)
    assert project(clean, good, [2])["predictions"][0]["buffer_broadcast_s"] == 0


def test_idle_penalty_is_paid_once_per_call_whatever_n(tmp_path):
    """Hand-built gap-timed comm run: back-to-back means follow an exact α–β model t(s, n), the
    means after the gap are 1.5 × that. At the benchmark's n = 2 the projected call is the mean
    after the gap; at n = 4 it is t(s, 4) + the idle penalty 0.5·t(s, 2), not 1.5·t(s, 4): the
    penalty is once per call, the ring steps come from the back-to-back times."""
    comm = fake_comm(
        tmp_path / "comm", alpha_us=50.0, bus_gbps=2.0, mean_factor=1.5, back_to_back=1.0,
        config={"devices": ["cpu", "cpu"], "gap_ms": {"all_reduce": 15.0}},
    )  # fmt: skip
    phases = {"data": 0.001, "forward": 0.004, "backward": 0.008, "optimizer": 0.002}
    bucket = 1 << 20
    run = fake_run(tmp_path / "s", mode="single", n=1, phases=phases, buckets=[bucket])
    out = project(run, comm, [2, 4])
    ar = {"collective": "all_reduce", "alpha_us": 50.0, "bus_gbps": 2.0}
    t2, t4 = (collective_time_us(ar, bucket, n) / 1e6 for n in (2, 4))
    two, four = out["predictions"]
    assert two["exposed_comm_s"] == pytest.approx(1.5 * t2, rel=1e-6)
    assert four["exposed_comm_s"] == pytest.approx(t4 + 0.5 * t2, rel=1e-6)
    model = out["inputs"]["all_reduce_model"]
    assert model["alpha_us"] == pytest.approx(50.0) and model["bus_gbps"] == pytest.approx(2.0)
    assert any("idle penalty" in a for a in out["assumptions"])
    # the report shows record strings up to DISPLAY_CHARS: an assumption must not be cut there
    from analysis.jsonsafe import DISPLAY_CHARS

    assert all(len(a) <= DISPLAY_CHARS for a in out["assumptions"])
    fit = project(run, comm, [4], bandwidth="fit")["predictions"][0]
    assert fit["exposed_comm_s"] == pytest.approx(t4 + 0.5 * t2, rel=1e-6)
