"""Issue 2: the same training in every mode. Real runs through the real launcher (torchrun, gloo).

The equivalence test is the proof of "identical training": single-device with a global batch of
64 and DDP with 2 x 32 give the same per-step loss and the same final weights.
"""

from __future__ import annotations

import csv
import gzip
import json
import threading

import msgspec
import pytest
import torch

from profiler.runfolder.stepmetrics import step_metrics
from tests.conftest import TINY, launch, read_run
from tests.test_runfolder import step_rows
from workloads.config import TrainConfig, to_argv
from workloads.plan import Environment, batch_split, plan
from workloads.runrecord import run_config
from workloads.train.checkpoint import load_checkpoint
from workloads.train.context import AutocastForward, unwrap_model
from workloads.train.data import GlobalBatchSampler
from workloads.train.loop import build_parser
from workloads.train.losses import best_epoch

STEPS = int(TINY[TINY.index("--max-steps") + 1])  # of the golden workload and its fresh runs

# The field lists of docs/reference/run-folder.md.
RUN_KEYS = set(
    """schema_version run_id status error created_at finished_at config env metrics eval traces
    warnings""".split()
)
CONFIG_KEYS = set(
    """mode backend world_size nnodes nproc_per_node devices model model_args dataset dataset_args
    loss model_facts global_batch
    per_device_batch scaling amp seed epochs max_steps lr momentum weight_decay sync_bn num_workers
    pin_memory warmup_steps eval_batches rendezvous ddp zero fsdp profile grad_accum_steps micro_batch
    sweep_id repeat_id repeat_round""".split()
)
ENV_KEYS = set(
    """os platform python torch cuda nccl gpus cpu_model cpu_cores threads_per_rank hostname
    host_load device_memory_bytes""".split()
)
METRIC_KEYS = set(
    """samples_per_s step_time_s per_rank epoch_time_s wall_time_s memory memory_after_first_step
    memory_breakdown ddp fsdp param_grad_bytes buffer_bytes_by_dtype profiler_overhead_pct
    profiler_overhead_noise_pct""".split()
)
STEPS_HEADER = """rank epoch step warmup profiled step_time_s data_s forward_s backward_s optimizer_s
    profiler_s samples loss rss_bytes cuda_allocated_bytes other_cpu_cores""".split()


def read_steps(run_dir) -> list[dict]:
    with open(run_dir / "steps.csv", newline="") as f:
        return list(csv.DictReader(f))


# --- the global-order sampler and the config (pure, fast) -------------------------------------


def test_ddp_shards_partition_the_single_device_batches():
    single = GlobalBatchSampler(num_samples=200, global_batch=64, rank=0, replicas=1, seed=3)
    ranks = [
        GlobalBatchSampler(num_samples=200, global_batch=64, rank=r, replicas=2, seed=3)
        for r in range(2)
    ]
    for epoch in (0, 1):
        for s in (single, *ranks):
            s.set_epoch(epoch)
        batches = list(single)
        assert len(batches) == 3 == len(single)  # last partial global batch dropped
        for step, (full, r0, r1) in enumerate(zip(batches, *ranks, strict=True)):
            assert r0 + r1 == full, f"epoch {epoch} step {step}"
    single.set_epoch(0)
    first = list(single)
    single.set_epoch(1)
    assert list(single) != first  # set_epoch changes the order
    single.set_epoch(0, start=2)
    assert list(single) == first[2:]  # resuming skips the steps already done


def test_batch_split_strong_and_weak():
    assert batch_split(TrainConfig(batch_size=64), 2) == (64, 32)
    assert batch_split(TrainConfig(batch_size=64, scaling="weak"), 4) == (256, 64)
    with pytest.raises(ValueError, match="not divisible by 3"):
        batch_split(TrainConfig(batch_size=64), 3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": "vgg"}, "--model 'vgg' is not a built-in"),
        ({"batch_size": 0}, "--batch-size must be >= 1"),
        ({"max_steps": 2, "warmup_steps": 2}, "raise --max-steps"),
        ({"comm_hook": "int8"}, "--comm-hook must be one of"),
        ({"run_id": "a/b"}, "not a path"),
    ],
)
def test_config_rejects_bad_values_with_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_autocast_forward_keeps_the_dtype_in_other_threads():
    """DataParallel runs replicas in fresh threads that re-enter autocast with the thread's
    default dtype; the wrapper keeps the requested one there. Shown on CPU, where the default
    autocast dtype is bf16 and we ask for fp16 (on CUDA it is the other way round)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    wrapped = AutocastForward(layer, device_type="cpu", dtype=torch.float16)
    x = torch.randn(2, 4)
    out: dict = {}

    def replica_thread() -> None:  # what parallel_apply's worker does around each replica
        for name, module in (("plain", layer), ("wrapped", wrapped)):
            with torch.autocast("cpu", enabled=True):
                out[name] = module(x).dtype

    with torch.autocast("cpu", dtype=torch.float16):
        thread = threading.Thread(target=replica_thread)
        thread.start()
        thread.join()
    assert out == {"plain": torch.bfloat16, "wrapped": torch.float16}
    # Checkpoints and eval see the plain module through any wrapper stack.
    assert unwrap_model(torch.nn.DataParallel(wrapped)) is layer


def test_to_argv_round_trips_through_the_train_parser():
    cfg = TrainConfig(mode="ddp", model="mlp", amp="bf16", profile=False, sync_bn=True, lr=0.1)
    ns = build_parser().parse_args(to_argv(cfg))
    assert TrainConfig(**vars(ns)) == cfg
    two_gpus = Environment(
        system="Linux", cuda=True, gpus=2, nccl=True, cpu_cores=8, torch_threads=8
    )
    record = msgspec.to_builtins(run_config(cfg, plan(cfg, two_gpus, nproc=2)))
    assert set(record) == CONFIG_KEYS and record["per_device_batch"] == 32
    assert (record["world_size"], record["devices"]) == (2, ["cuda:0", "cuda:1"])


def test_step_metrics_exclude_warmup_and_use_the_slowest_rank():
    rows = [
        {"rank": r, "warmup": int(s == 0), "step_time_s": t, "samples": 32}
        for r, times in ((0, [9.0, 1.0, 1.0]), (1, [9.0, 2.0, 2.0]))
        for s, t in enumerate(times)
    ]
    m, _ = step_metrics(step_rows(rows))
    assert m.samples_per_s == pytest.approx(4 * 32 / 4.0)  # 128 samples / rank 1's 4 s
    assert [p.samples_per_s for p in m.per_rank] == pytest.approx([32.0, 16.0])
    assert m.step_time_s.mean == pytest.approx(1.5)
    assert (
        best_epoch([{"epoch": 0, "top1_pct": 50.0}, {"epoch": 1, "top1_pct": 40.0}])["epoch"] == 0
    )


# --- real runs ---------------------------------------------------------------------------


def _check_complete(run_dir, *, mode, world):
    run = read_run(run_dir)
    assert set(run) == RUN_KEYS
    assert run["status"] == "ok" and run["error"] is None and run["schema_version"] == 2
    cfg = run["config"]
    assert set(cfg) == CONFIG_KEYS
    assert (cfg["mode"], cfg["world_size"], cfg["global_batch"]) == (mode, world, 64)
    assert cfg["per_device_batch"] == 64 // world and cfg["devices"] == ["cpu"] * world
    assert set(run["env"]) == ENV_KEYS and run["env"]["threads_per_rank"] >= 1
    metrics = run["metrics"]
    assert set(metrics) == METRIC_KEYS
    assert metrics["samples_per_s"] > 0 and len(metrics["per_rank"]) == world
    # 8 steps - 2 warm-up - 3 the profiler traced (its warm-up step 1 and active steps 2-4)
    assert all(p["steps"] == 3 for p in metrics["per_rank"]) and run["warnings"] == []
    assert [m["rank"] for m in metrics["memory"]] == list(range(world))
    assert all(m["peak_rss_bytes"] > 0 for m in metrics["memory"])
    assert len(run["eval"]["epochs"]) == 1 and run["eval"]["best"] == run["eval"]["epochs"][0]
    assert run["eval"]["best"]["samples"] == 512
    assert run["traces"] and all((run_dir / t).is_file() for t in run["traces"])
    with open(run_dir / "steps.csv", newline="") as f:
        assert next(csv.reader(f)) == STEPS_HEADER
    rows = read_steps(run_dir)
    assert len(rows) == 8 * world
    assert sorted({int(r["rank"]) for r in rows}) == list(range(world))
    assert [int(r["warmup"]) for r in rows if r["rank"] == "0"] == [1, 1, 0, 0, 0, 0, 0, 0]
    assert [int(r["profiled"]) for r in rows if r["rank"] == "0"] == [0, 1, 1, 1, 1, 0, 0, 0]
    assert all(int(r["samples"]) == 64 // world for r in rows)
    for r in range(world):
        assert (run_dir / "logs" / f"rank{r}.log").read_text().strip()
    return run


def test_single_run_writes_a_complete_run_folder(single_mlp_run):
    run = _check_complete(single_mlp_run, mode="single", world=1)
    assert run["config"]["backend"] == "none" and run["metrics"]["ddp"] is None


def test_ddp_gloo_run_writes_a_complete_run_folder(ddp_mlp_run):
    run = _check_complete(ddp_mlp_run, mode="ddp", world=2)
    assert run["config"]["backend"] == "gloo" and run["config"]["nproc_per_node"] == 2
    assert run["env"]["threads_per_rank"] == max(1, run["env"]["cpu_cores"] // 2)
    ddp = run["metrics"]["ddp"]
    assert ddp["num_buckets"] == len(ddp["bucket_sizes_bytes"]) >= 1
    assert sum(ddp["bucket_sizes_bytes"]) == ddp["grad_bytes_total"] == 4 * ddp["param_count"]
    assert "torch.distributed.run" in (ddp_mlp_run / "logs" / "launcher.log").read_text()


def test_every_mode_reports_the_same_eval(single_mlp_run, ddp_mlp_run):
    single, ddp = read_run(single_mlp_run)["eval"]["best"], read_run(ddp_mlp_run)["eval"]["best"]
    assert ddp["samples"] == single["samples"]
    assert ddp["test_loss"] == pytest.approx(single["test_loss"], abs=1e-4)
    assert ddp["top1_pct"] == pytest.approx(single["top1_pct"], abs=0.5)


@pytest.fixture(scope="module")
def equivalence_runs(fresh_golden):
    """Single device (global batch 64) and 2-rank gloo DDP (2 x 32) of the golden workload
    (TINY: MLP, 8 steps, seed 0, profiled), made now by the real launcher, with checkpoints."""
    return fresh_golden("single-mlp"), fresh_golden("ddp-gloo-mlp")


@pytest.mark.integration
def test_single_and_ddp_train_identically(equivalence_runs):
    single_dir, ddp_dir = equivalence_runs
    single = {int(r["step"]): float(r["loss"]) for r in read_steps(single_dir)}
    per_rank: dict[int, list[float]] = {}
    for r in read_steps(ddp_dir):
        per_rank.setdefault(int(r["step"]), []).append(float(r["loss"]))
    assert sorted(single) == sorted(per_rank) == list(range(STEPS))
    for step, loss in single.items():
        assert len(per_rank[step]) == 2
        # DDP's loss is the mean of the two half-batch means = the single full-batch mean.
        assert sum(per_rank[step]) / 2 == pytest.approx(loss, abs=1e-5), f"step {step}"
    a = load_checkpoint(single_dir / "checkpoint.pt")
    b = load_checkpoint(ddp_dir / "checkpoint.pt")
    # It actually trains: SGD's momentum is non-zero for every parameter (8 steps of this MLP
    # barely move the loss, so the loss alone could not show it).
    momenta = [s["momentum_buffer"] for s in a["optimizer"]["state"].values()]
    assert len(momenta) == len(a["model"]) and all(m.abs().sum() > 0 for m in momenta)
    assert a["loop"]["step"] == b["loop"]["step"] == STEPS
    assert a["model"].keys() == b["model"].keys()
    for name, w in a["model"].items():
        assert not name.startswith("module.")  # unwrapped state_dict
        torch.testing.assert_close(b["model"][name], w, atol=1e-5, rtol=0)
    ev = json.loads(a["loop"]["evals"])[0]
    assert read_run(ddp_dir)["eval"]["best"]["test_loss"] == pytest.approx(
        ev["test_loss"], abs=1e-5
    )


# --- gradient accumulation (issue 10) -------------------------------------------------------


def test_grad_accum_splits_each_share_into_micro_batches():
    cfg = TrainConfig(mode="ddp", batch_size=64, grad_accum_steps=2)
    two_cpus = Environment(
        system="Linux", cuda=False, gpus=0, nccl=False, cpu_cores=2, torch_threads=2
    )
    record = msgspec.to_builtins(run_config(cfg, plan(cfg, two_cpus, nproc=2)))
    # global batch = per-device micro-batch x world x K
    assert (record["global_batch"], record["micro_batch"], record["grad_accum_steps"]) == (
        64,
        16,
        2,
    )
    assert record["micro_batch"] * 2 * 2 == record["global_batch"]
    with pytest.raises(ValueError, match="multiple of 24"):
        batch_split(TrainConfig(batch_size=60, grad_accum_steps=8), 3)
    with pytest.raises(ValueError, match="--grad-accum-steps must be >= 1"):
        TrainConfig(grad_accum_steps=0)


@pytest.fixture(scope="module")
def accum_run(tmp_path_factory):
    """DDP, 2 ranks, K = 2 micro-batches of 16 per optimizer step (global batch 64), profiled so
    the traces show how many all-reduces each step makes; otherwise as `equivalence_runs`."""
    runs = tmp_path_factory.mktemp("accum")
    args = [*TINY, "--checkpoint", "--mode", "ddp", "--nproc", "2", "--backend", "gloo"]
    launch([*args, "--grad-accum-steps", "2", "--run-id", "eq-ddp-accum", "--runs-dir", str(runs)])
    return runs / "eq-ddp-accum"


@pytest.mark.integration
def test_ddp_grad_accum_trains_like_single_device(equivalence_runs, accum_run):
    single_dir, _ = equivalence_runs
    single = {int(r["step"]): float(r["loss"]) for r in read_steps(single_dir)}
    per_step: dict[int, list[float]] = {}
    for r in read_steps(accum_run):
        per_step.setdefault(int(r["step"]), []).append(float(r["loss"]))
        assert int(r["samples"]) == 32  # each rank's share of the step: 2 micro-batches of 16
    assert sorted(per_step) == list(range(STEPS))
    for step, loss in single.items():
        assert sum(per_step[step]) / 2 == pytest.approx(loss, abs=1e-5), f"step {step}"
    a = load_checkpoint(single_dir / "checkpoint.pt")["model"]
    b = load_checkpoint(accum_run / "checkpoint.pt")["model"]
    for name, w in a.items():
        torch.testing.assert_close(b[name], w, atol=1e-5, rtol=0)
    config = read_run(accum_run)["config"]
    assert (config["grad_accum_steps"], config["micro_batch"], config["global_batch"]) == (
        2,
        16,
        64,
    )


@pytest.mark.integration
def test_ddp_grad_accum_all_reduces_once_per_optimizer_step(accum_run):
    """no_sync on the first micro-batch: each traced step holds one all-reduce per bucket, not
    two (which the same math without no_sync would make)."""
    run = read_run(accum_run)
    buckets = run["metrics"]["ddp"]["num_buckets"]
    for trace in run["traces"]:
        with gzip.open(accum_run / trace, "rt") as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
        forwards = [e for e in events if e["name"] == "forward"]
        assert len(steps) == 3  # the default schedule's active steps
        for step in steps:
            lo, hi = step["ts"], step["ts"] + step["dur"]
            inside = [e for e in events if lo <= e["ts"] < hi]
            assert sum(e["name"] == "gloo:all_reduce" for e in inside) == buckets
            assert sum(e in forwards for e in inside) == 2  # two micro-batches
