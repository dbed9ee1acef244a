"""workloads.plan: the one planner the launcher and every training process share.

Machines are described by hand (`Environment`), so GPU and Windows layouts are checked on any
machine; the last test checks that a real launched run recorded exactly what the plan says."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import read_run
from workloads.config import TrainConfig
from workloads.plan import Environment, plan, runnable_plan, torchrun_layout

CPU = Environment(system="Linux", cuda=False, gpus=0, nccl=False, cpu_cores=8, torch_threads=8)
GPUS = Environment(system="Linux", cuda=True, gpus=4, nccl=True, cpu_cores=32, torch_threads=16)
WINDOWS = dataclasses.replace(GPUS, system="Windows", nccl=False)


def cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"model": "mlp", "batch_size": 64, **kw})


def layout(p) -> tuple:
    return (p.backend, p.nproc, p.replicas, p.devices, p.global_batch, p.per_device_batch)


def test_cpu_layouts_split_cores_and_batch():
    single = plan(cfg(), CPU)
    assert layout(single) == ("none", 1, 1, ["cpu"], 64, 64)
    assert single.threads_per_rank == 8 and single.reason is None and not single.use_cuda
    ddp = plan(cfg(mode="ddp"), CPU)  # default: 2 processes on CPU, gloo
    assert layout(ddp) == ("gloo", 2, 2, ["cpu", "cpu"], 64, 32)
    assert ddp.threads_per_rank == 4
    assert plan(cfg(mode="ddp", threads=3), CPU).threads_per_rank == 3  # --threads N wins
    two_nodes = plan(cfg(mode="ddp"), CPU, nproc=2, nnodes=2)
    assert layout(two_nodes) == ("gloo", 2, 4, ["cpu"] * 4, 64, 16)
    weak = plan(cfg(mode="ddp", scaling="weak"), CPU, nproc=4)
    assert (weak.global_batch, weak.per_device_batch, weak.threads_per_rank) == (256, 64, 2)


def test_gpu_layouts_one_device_per_replica():
    ddp = plan(cfg(mode="ddp"), GPUS)  # default: one process per GPU, nccl on Linux
    assert layout(ddp) == ("nccl", 4, 4, [f"cuda:{i}" for i in range(4)], 64, 16)
    assert ddp.threads_per_rank == 16 and ddp.use_cuda  # GPU ranks keep torch's threads
    nodes = plan(cfg(mode="ddp"), GPUS, nproc=2, nnodes=2)
    assert nodes.devices == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"] and nodes.replicas == 4
    # DP: one process over --nproc GPUs, else --dp-gpus, else every visible GPU.
    assert layout(plan(cfg(mode="dp"), GPUS, nproc=2)) == (
        "none",
        1,
        2,
        ["cuda:0", "cuda:1"],
        64,
        32,
    )
    assert plan(cfg(mode="dp", dp_gpus=2), GPUS).replicas == 2
    assert plan(cfg(mode="dp"), GPUS).devices == [f"cuda:{i}" for i in range(4)]
    assert plan(cfg(device="cpu"), GPUS).devices == ["cpu"]
    assert plan(cfg(mode="ddp", device="cpu"), GPUS).backend == "gloo"
    assert plan(cfg(mode="ddp"), WINDOWS).backend == "gloo"  # auto never picks nccl there


@pytest.mark.parametrize(
    ("env", "kw", "nproc", "reason"),
    [
        (CPU, {"device": "cuda"}, None, "--device cuda but torch sees no CUDA device"),
        (CPU, {"mode": "dp"}, None, "--mode dp needs at least one CUDA device"),
        (CPU, {"mode": "ddp", "backend": "nccl"}, None, "--backend nccl needs CUDA GPUs"),
        (WINDOWS, {"mode": "ddp", "backend": "nccl"}, 2, "NCCL is not available on Windows"),
        (GPUS, {"mode": "ddp"}, 5, "--nproc 5 is above the 4 visible GPU(s)"),
        (GPUS, {"mode": "dp", "dp_gpus": 6}, None, "--dp-gpus 6 is above the 4 visible GPU(s)"),
        (CPU, {"mode": "ddp", "sync_bn": True}, 2, "--sync-bn needs CUDA devices"),
        (CPU, {"mode": "ddp"}, 3, "not divisible by 3"),
    ],
)
def test_what_cannot_run_here_is_a_reason_with_null_devices_and_batch(env, kw, nproc, reason):
    """A refused plan is what a skipped run records: no devices, no batch split, no threads."""
    p = plan(cfg(**kw), env, nproc=nproc)
    assert reason in p.reason
    assert (p.devices, p.global_batch, p.per_device_batch, p.threads_per_rank) == (None,) * 4


def test_requests_wrong_on_any_machine_raise():
    with pytest.raises(ValueError, match="--nproc must be >= 1"):
        plan(cfg(mode="ddp"), CPU, nproc=0)


def test_more_cpu_ranks_than_cores_is_a_warning_with_one_thread_each():
    p = plan(cfg(mode="ddp"), dataclasses.replace(CPU, cpu_cores=2), nproc=4)
    assert p.reason is None and p.threads_per_rank == 1
    assert "--nproc 4 exceeds the 2 CPU cores" in p.warnings[0]


def test_runnable_plan_refuses_with_the_tools_error_and_prints_its_warnings(capsys):
    """bench-comm and tune-ddp run one job: the plan's reason is their one-line error."""

    class ToolError(Exception):
        pass

    with pytest.raises(ToolError, match="--mode dp needs at least one CUDA device"):
        runnable_plan(cfg(mode="dp"), CPU, prog="tool", error=ToolError)
    p = runnable_plan(cfg(mode="ddp"), dataclasses.replace(CPU, cpu_cores=2), prog="tool", nproc=4)
    assert p.replicas == 4
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("tool: warning: --nproc 4 exceeds the 2 CPU cores")


def test_torchrun_layout_is_what_init_context_plans_with():
    env = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    assert torchrun_layout("ddp", env) == {"nproc": 4, "nnodes": 2}
    assert torchrun_layout("ddp", {"WORLD_SIZE": "2"}) == {"nproc": 2, "nnodes": 1}
    assert torchrun_layout("single", env) == {} and torchrun_layout("ddp", {}) == {}


def test_the_trainer_records_the_plan_the_launcher_made(ddp_mlp_run):
    """The run.json written by rank 0 of a real torchrun job holds the layout `plan` gives for
    the same request on this machine: launcher and trainer plan with the same function."""
    run = read_run(ddp_mlp_run)
    config = run["config"]
    request = TrainConfig(
        mode="ddp", backend="gloo", model="mlp", batch_size=64, device="cpu", max_steps=8
    )
    p = plan(request, Environment.detect(), nproc=2)
    assert (config["backend"], config["nproc_per_node"], config["world_size"]) == ("gloo", 2, 2)
    assert layout(p) == (
        config["backend"],
        config["nproc_per_node"],
        config["world_size"],
        config["devices"],
        config["global_batch"],
        config["per_device_batch"],
    )
    assert run["env"]["threads_per_rank"] == p.threads_per_rank


def test_bench_overhead_plain_worker_runs(capsys):
    """bench-overhead's reference arm (a bare loop in its own process) imports the planner's core
    count; it once imported it from a module that no longer had it, and only `make bench-overhead`
    found out. One tiny real run keeps the arm importable and its output parseable."""
    import json

    from bench.overhead import main as overhead_main

    args = ["--plain-worker", "--model", "mlp", "--batch", "8", "--steps", "4", "--device", "cpu"]
    assert overhead_main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["samples_per_s"] > 0
