"""The data-parallel family (issue 30), in process: the mode options and their bad inputs, the
FSDP2 wrap rule, the sharded memory count on a real 1-rank gloo group, collectives named from
their c10d op on hand-built events, the family comparison and capacity, the sharded
projection's timeline and ZeRO-1's partition, all against hand computations. The real 2-rank
runs are in tests/test_family_runs.py."""

from __future__ import annotations

import copy
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from analysis.project.sharded_step import fsdp_timeline, fullest_share
from analysis.runs.family import budget_bytes, family_summary, strategy
from analysis.trace.classify import classify
from analysis.trace.collectives import rank_instances
from analysis.trace.crossrank import combine_collectives
from analysis.trace.intervals import covered_us, intersection_us, merge
from analysis.trace.loader import load_trace
from profiler.runfolder.errors import InputError
from workloads.config import TrainConfig
from workloads.spec import SpecError
from workloads.tools import demo, sweep
from workloads.train.gpt import gpt
from workloads.train.models import build_model
from workloads.train.sharding import sgd, shard_model, wrap_targets

MLP_LINEARS = [(3072, 256), (256, 256), (256, 10)]  # the built-in MLP's Linear (in, out)


def _block_bytes(i: int, o: int) -> int:
    return (i * o + o) * 4  # weight and bias, fp32


@pytest.mark.parametrize(
    "kw, text",
    [
        ({"mode": "single", "zero": 1}, "--zero 1 shards DDP's optimizer state, so it needs --mode ddp"),
        ({"mode": "dp", "zero": 1}, "(got --mode dp)"),
        ({"mode": "fsdp", "zero": 1}, "FSDP already shards the optimizer state"),
        ({"mode": "ddp", "fsdp_wrap": "torch.nn:Linear"}, "--fsdp-wrap applies to --mode fsdp"),
        ({"mode": "ddp", "fsdp_reshard_after_forward": "false"}, "applies to --mode fsdp"),
        ({"mode": "fsdp", "fsdp_wrap": "Linear"}, "name classes as MODULE:CLASS"),
        ({"mode": "fsdp", "sync_bn": True}, "--sync-bn converts BatchNorm for DDP"),
        ({"mode": "ddp", "zero": 2}, "--zero must be one of 0, 1"),
    ],
)  # fmt: skip
def test_family_options_refused_in_one_line(kw: dict, text: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        TrainConfig(**kw)
    assert text in str(err.value) and "\n" not in str(err.value)


FAST = "--model mlp --dataset synthetic --max-steps 4 --batch-size 32 --no-profile --device cpu"


@pytest.mark.parametrize(
    "args, text",
    [
        ("--mode single --zero 1", "--zero 1 shards DDP's optimizer state, so it needs --mode ddp"),
        ("--mode dp --zero 1", "(got --mode dp); drop --zero or use --mode ddp"),
        ("--mode all --zero 1", "--zero belongs to one mode but --mode all runs"),
        ("--mode all --fsdp-wrap torch.nn:Linear", "run that mode on its own (--mode fsdp)"),
        ("--mode fsdp --nproc 2 --fsdp-wrap torch.nn:Conv2d",
         "--fsdp-wrap torch.nn:Conv2d: the model (Sequential) contains no Conv2d; its classes:"),
        ("--mode fsdp --nproc 2 --fsdp-wrap nosuch.mod:Block", "module nosuch.mod does not import"),
    ],
)  # fmt: skip
def test_the_launcher_refuses_them_in_one_line_writing_nothing(args, text, tmp_path, capsys):
    """Through the launcher, as a user types them: exit 2, one line, no runs folder (in process:
    a case that slipped past the checks would start a child, which the fast tier refuses)."""
    from workloads.launch import launcher

    runs = tmp_path / "runs"
    assert launcher.main([*FAST.split(), *args.split(), "--runs-dir", str(runs)]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and text in lines[0], lines
    assert not runs.exists()


def test_fsdp_on_one_rank_and_zero_under_ddp_are_allowed() -> None:
    assert TrainConfig(mode="fsdp", fsdp_wrap="torch.nn:Linear").fsdp_classes() == [
        ("torch.nn", "Linear")
    ]
    assert TrainConfig(mode="ddp", zero=1).zero == 1
    assert not TrainConfig(mode="fsdp", fsdp_reshard_after_forward="false").reshard_after_forward


def test_default_wrap_rule_takes_top_level_container_elements() -> None:
    cfg = TrainConfig(mode="fsdp")
    mlp = build_model("mlp", num_classes=10)
    assert [n for n, _ in wrap_targets(mlp, cfg)] == ["1", "3", "5"]  # Linears; ReLUs hold none
    net = gpt(num_classes=16, n_layer=3, n_embd=16, n_head=2)
    assert [n for n, _ in wrap_targets(net, cfg)] == ["blocks.0", "blocks.1", "blocks.2"]


def test_fsdp_wrap_names_classes_and_refuses_one_the_model_lacks() -> None:
    net = gpt(num_classes=16, n_layer=2, n_embd=16, n_head=2)
    picked = wrap_targets(net, TrainConfig(mode="fsdp", fsdp_wrap="torch.nn:LayerNorm"))
    assert [n for n, _ in picked] == ["blocks.0.ln_1", "blocks.0.ln_2", "blocks.1.ln_1",
                                      "blocks.1.ln_2", "ln_f"]  # fmt: skip
    with pytest.raises(SpecError) as err:
        wrap_targets(net, TrainConfig(mode="fsdp", fsdp_wrap="torch.nn:Conv2d"))
    assert "--fsdp-wrap torch.nn:Conv2d: the model (GPT) contains no Conv2d" in str(err.value)
    with pytest.raises(SpecError, match="module nosuch does not import"):
        wrap_targets(net, TrainConfig(mode="fsdp", fsdp_wrap="nosuch:Block"))


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_torchvision_model_shards_by_the_default_rule_and_trains_as_unsharded(
    one_rank_group,
) -> None:
    """torchvision's resnet18: its BasicBlocks (the elements of layer1..layer4) are the blocks;
    an SGD step on one rank moves the loss as on the unsharded model (one rank: nothing to
    reorder)."""
    cfg = TrainConfig(mode="fsdp", model="torchvision:resnet18")
    x, y = torch.randn(2, 3, 16, 16), torch.tensor([0, 1])
    torch.manual_seed(0)
    plain = build_model("torchvision:resnet18", num_classes=10)
    sharded, names = shard_model(copy.deepcopy(plain), cfg)
    assert names == [f"layer{i}.{j}" for i in range(1, 5) for j in (0, 1)] + [""]
    losses = []
    for model in (plain, sharded):
        opt = sgd(model.parameters(), cfg, zero=False)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        with torch.no_grad():  # after the step: the update was the same
            losses.append((loss.item(), torch.nn.functional.cross_entropy(model(x), y).item()))
    assert losses[1] == pytest.approx(losses[0], abs=1e-5)


def _count(model, opt, steps: int = 3) -> dict:
    from profiler.memory_breakdown import StaticMemory

    static = StaticMemory(rank=0, devices=[torch.device("cpu")], planned_steps=steps)
    for step in range(steps):
        static.before_step(model, step)
        model(torch.randn(4, 3, 32, 32)).sum().backward()
        static.after_backward(model, step)
        opt.step()
        opt.zero_grad(set_to_none=True)
        static.after_optimizer(model, opt, step)
    (entry,) = static.entries()
    return entry


@pytest.mark.parametrize("reshard", ["true", "false"])
def test_fsdp_memory_on_one_rank_matches_the_hand_count(one_rank_group, reshard: str) -> None:
    """One rank holds every shard: parameters, gradients and SGD momentum are the model's bytes,
    no DDP buckets; gathered at once: the largest block when each block reshards after forward
    (at one rank an all-gather completes at once, so no prefetch is in flight), every block
    when none does."""
    torch.manual_seed(0)
    cfg = TrainConfig(mode="fsdp", fsdp_reshard_after_forward=reshard)
    model, names = shard_model(build_model("mlp", num_classes=10), cfg)
    assert names == ["1", "3", "5", ""]
    e = _count(model, sgd(model.parameters(), cfg, zero=False))
    total = sum(_block_bytes(i, o) for i, o in MLP_LINEARS)
    assert e["parameters_bytes"] == e["gradients_bytes"] == e["optimizer_state_bytes"] == total
    assert e["ddp_buckets_bytes"] == 0 and e["static_total_bytes"] == 3 * total
    largest = _block_bytes(*MLP_LINEARS[0])
    assert e["fsdp_unsharded_peak_bytes"] == (largest if reshard == "true" else total)


def test_zero1_counts_its_inner_optimizers_state(one_rank_group) -> None:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build_model("mlp", num_classes=10))
    e = _count(model, sgd(model.parameters(), TrainConfig(mode="ddp", zero=1), zero=True))
    total = sum(_block_bytes(i, o) for i, o in MLP_LINEARS)
    assert e["optimizer_state_bytes"] == total  # one rank owns every parameter's momentum
    assert e["fsdp_unsharded_peak_bytes"] is None


@pytest.mark.parametrize("reshard", [True, False])
def test_a_scripts_own_sharding_is_recorded_as_seen(one_rank_group, reshard: bool) -> None:
    """What --script records of a model the script shards itself and of a ZeRO-1 optimizer
    (run.json config.fsdp and config.zero)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from profiler.memory_sharded import sharding_seen
    from profiler.runfolder.schema import FsdpConfig

    model = build_model("mlp", num_classes=10)
    for layer in (model[1], model[3], model[5]):
        fully_shard(layer, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    seen = sharding_seen(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert seen == {
        "zero": 0,
        "fsdp_config": FsdpConfig(wrap="seen", reshard_after_forward=reshard),
    }
    ddp = torch.nn.parallel.DistributedDataParallel(build_model("mlp", num_classes=10))
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    assert sharding_seen(ddp, zero) == {"zero": 1, "fsdp_config": None}


def _x(name: str, ts: float, dur: float, tid: int, cat: str = "cpu_op", **args):
    return SimpleNamespace(
        ph="X", cat=cat, name=name, ts=ts, dur=dur, tid=tid, args=json.dumps(args)
    )


def test_gloo_reduce_scatter_is_named_from_its_c10d_op_and_sized_by_its_input(tmp_path) -> None:
    """An FSDP2 step on gloo as torch 2.14 records it: the c10d ops on the training thread, the
    backend's annotations on gloo's threads (an all-gather's input shape is one shard; the
    reduce-scatter runs as an all-reduce of the whole input)."""
    ua = "user_annotation"
    events = [
        _x("ProfilerStep#1", 0, 1000, 1, ua),
        _x("forward", 10, 300, 1, ua),
        _x("c10d::_allgather_base_", 20, 5, 1, **{"Input Dims": [[248], [124], [], [], []],
           "Input type": ["float", "float", "", "Scalar", "Scalar"]}),
        _x("gloo:all_gather", 30, 100, 7, ua, **{"Input Dims": [[124]], "Input type": ["float"]}),
        _x("aten::mm", 140, 100, 1),
        _x("backward", 400, 400, 1, ua),
        _x("aten::mm", 410, 200, 1),
        _x("c10d::_reduce_scatter_base_", 620, 5, 1, **{"Input Dims": [[124], [248], [], [], [], []],
           "Input type": ["float", "float", "", "", "Scalar", "Scalar"]}),
        _x("gloo:all_reduce", 630, 100, 8, ua, **{"Input Dims": [[248]], "Input type": ["float"]}),
        _x("ProfilerStep#2", 1000, 10, 1, ua),
    ]  # fmt: skip
    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": e.ph, "cat": e.cat, "name": e.name, "ts": e.ts, "dur": e.dur, "tid": e.tid,
         "pid": 1, "args": json.loads(e.args)} for e in events]}))  # fmt: skip
    c = classify(load_trace(trace).event_chunks())
    compute = merge(np.array([140.0, 410.0]), np.array([240.0, 610.0]))
    inst = rank_instances(c, 0, 1000, compute)
    assert list(inst) == ["gloo:all_gather", "gloo:reduce_scatter"]
    ag, rs = inst["gloo:all_gather"], inst["gloo:reduce_scatter"]
    assert ag["bytes"].tolist() == [248 * 4] and rs["bytes"].tolist() == [248 * 4]  # nccl-tests
    assert ag["algorithm"] == "gloo:all_gather" and rs["algorithm"] == "gloo:all_reduce"
    assert ag["phase"].tolist() == [1] and rs["phase"].tolist() == [2]  # forward, backward
    assert ag["exposed_us"].tolist() == [100.0]  # nothing computes during it
    two = {0: inst, 1: {k: dict(v) for k, v in inst.items()}}
    rows = {r["name"]: r for r in combine_collectives(two, 2)["collectives"]}
    # 992 B in 100 µs: algbw 0.00992 GB/s; busbw with the algorithm's factor at n = 2
    assert rows["gloo:all_gather"]["busbw_gbps"] == pytest.approx(0.00992 * 0.5)
    assert rows["gloo:reduce_scatter"]["busbw_gbps"] == pytest.approx(0.00992 * 1.0)
    (phase,) = rows["gloo:reduce_scatter"]["phases"]
    assert phase["phase"] == "backward" and phase["exposed_us_total"] == 100.0


def test_covered_length_matches_the_intersection() -> None:
    rng = np.random.default_rng(0)
    s = rng.uniform(0, 100, 50)
    merged = merge(s, s + rng.uniform(0, 5, 50))
    qs = rng.uniform(-10, 110, 100)
    qe = qs + rng.uniform(0, 20, 100)
    want = [
        intersection_us(merged, (np.array([a]), np.array([b]))) for a, b in zip(qs, qe, strict=True)
    ]
    assert covered_us(merged, qs, qe) == pytest.approx(want, abs=1e-9)


def _row(rid: str, strategy_: str, sps: float, static: int, gathered: int | None = None) -> dict:
    entry = {"rank": 0, "device": "cpu", "static_total_bytes": static, "buffers_bytes": 100,
             "parameters_bytes": 0, "fsdp_unsharded_peak_bytes": gathered}  # fmt: skip
    return {"run_id": rid, "status": "ok", "strategy": strategy_, "model": "m", "backend": "gloo",
            "world_size": 2, "parameters": 1000, "samples_per_s": sps, "device_type": "cpu",
            "device_memory_bytes": 8 * 2**30, "nproc_per_node": 2,
            "memory_breakdown": [entry]}  # fmt: skip


def test_family_saved_memory_throughput_and_capacity_by_hand() -> None:
    rows = [_row("d", "ddp", 100.0, 16_100), _row("z", "zero1", 90.0, 14_100),
            _row("f", "fsdp", 50.0, 6_100, 2_000)]  # fmt: skip
    (f,) = family_summary(rows, ("model",), budget_bytes=1_000_100)
    zero, fsdp = f["members"]
    assert (zero["saved_bytes"], zero["throughput_vs_ddp_pct"]) == (2_000, 90.0)
    assert fsdp["model_state_bytes"] == 8_100 and fsdp["saved_pct"] == pytest.approx(
        100 * 8_000 / 16_100
    )
    fits = {c["strategy"]: (c["bytes_per_param"], c["max_params"]) for c in f["capacity"]}
    # (state − buffers) ÷ P, then ⌊(budget − buffers) ÷ bytes per parameter⌋
    assert fits == {"ddp": (16.0, 62_500), "zero1": (14.0, 71_428), "fsdp": (8.0, 125_000)}
    (default,) = family_summary(rows, ("model",))  # the host's RAM ÷ 2 ranks per node
    assert default["budget_bytes"] == 4 * 2**30 and "÷ 2 ranks" in default["budget_source"]
    with pytest.raises(InputError, match="--memory-budget-gib"):
        budget_bytes(-1)
    assert strategy("ddp", 1, None) == "zero1" and strategy("fsdp", 0, False) == "fsdp_keep"


def test_fsdp_efficiency_split_by_hand() -> None:
    """Where a 2-rank FSDP2 run's efficiency went, built so every part is known: the single run
    1 s per step (data 0.1, forward 0.3, backward 0.5, optimizer 0.1); a 1-rank FSDP2 run 50 ms
    slower (FSDP2's own copies); the 2-rank run 1 s = the ideal 0.5 s + 0.4 s of all-gathers and
    reduce-scatters nothing hides (0.3 s of them in forward, more than its backward holds) +
    the 50 ms + 50 ms outside the phases. A 1-rank DDP run (25 ms) is not FSDP2's cost."""
    from analysis.runs.compare import WORKLOAD_KEY
    from analysis.runs.efficiency import attach_efficiency_loss
    from analysis.runs.groups import GroupEntry
    from tests.test_efficiency import hand_built, hand_run

    single, ddp1, _ = hand_built()
    fsdp1 = hand_run("fsdp1", "fsdp", 1, 64 / 1.05, {"data": 0.1, "forward": 0.32, "backward": 0.53,
                 "optimizer": 0.1, "step_time": 1.05}, strategy="fsdp")  # fmt: skip
    fsdp2 = hand_run("fsdp2", "fsdp", 2, 64 / 1.0, {"data": 0.05, "forward": 0.15 + 0.3 + 0.02,
                 "backward": 0.25 + 0.1 + 0.03, "optimizer": 0.05, "step_time": 1.0},
                 strategy="fsdp", exposed_comm_pct=40.0)  # fmt: skip
    for run in (fsdp1, fsdp2):
        run.scaling_efficiency = run.samples_per_s / 64.0 / run.world_size
        run.baseline_run_id = "single"
    group = GroupEntry(mode="fsdp", strategy="fsdp", world_size=2, run_ids=["fsdp2"],
                       scaling_efficiency_mean=0.5)  # fmt: skip
    attach_efficiency_loss([single, ddp1, fsdp1, fsdp2], [group],
                           lambda r: tuple(getattr(r, k) for k in WORKLOAD_KEY))  # fmt: skip
    want = {"exposed_comm": 40.0, "stragglers": 0.0, "data": 0.0, "ddp_overhead": 5.0,
            "host_contention": None, "contention": 0.0, "residual": 5.0}  # fmt: skip
    # host_contention None: the runs carry no per-step load, so nothing to tell apart
    assert fsdp2.efficiency_loss_pts == pytest.approx(want, abs=1e-9)
    assert group.efficiency_loss_pts == pytest.approx(want, abs=1e-9)


def test_fsdp_timeline_by_hand() -> None:
    """Two groups (root 1 element, block 3), forward 4 s, backward 8 s, every call 1 s, no
    forward prefetch (CPU): AG root [0,1], fwd root [1,2], AG block [2,3], fwd block [3,6];
    backward: AG block (re-gathered) [6,7], bwd block [7,13], RS block [13,14], bwd root
    [13,15] (no all-gather: the root keeps its parameters), RS root [15,16]."""
    groups = [{"module": "", "numel": 1, "unsharded_bytes": 10},
              {"module": "b", "numel": 3, "unsharded_bytes": 30}]  # fmt: skip
    line = fsdp_timeline(groups, 4.0, 8.0, lambda kind, nbytes: 1.0, reshard=True,
                         prefetch_forward=False)  # fmt: skip
    assert line == {"end_s": 16.0, "all_gather_s": 3.0, "reduce_scatter_s": 2.0}
    keep = fsdp_timeline(groups, 4.0, 8.0, lambda kind, nbytes: 1.0, reshard=False,
                         prefetch_forward=True)  # fmt: skip
    # prefetched: AG block issued at fwd root's start [1,2] -> fwd block [2,5]; bwd [5,11], [11,13]
    assert keep == {"end_s": 14.0, "all_gather_s": 2.0, "reduce_scatter_s": 2.0}


def test_zero_partition_share_is_torchs_greedy() -> None:
    sizes = [786_432, 256, 65_536, 256, 2_560, 10]  # the MLP's parameters (elements)
    assert fullest_share(sizes, 2) == pytest.approx(786_432 / sum(sizes))
    assert fullest_share(sizes, 1) == 1.0 and math.isclose(fullest_share([1, 1, 1, 1], 2), 0.5)


def test_sweep_and_demo_take_the_family_modes() -> None:
    todo = sweep.combos(["single", "zero1", "fsdp"], ["gloo"], [2], [0])
    args = {c.run_id("s"): c.launcher_args("s") for c in todo}
    assert args["s-zero1-gloo-n2-s0"][:4] == ["--mode", "ddp", "--zero", "1"]
    assert args["s-fsdp-gloo-n2-s0"][:2] == ["--mode", "fsdp"]
    assert demo.parse_modes("single ddp fsdp") == ["single", "ddp", "fsdp"]
    with pytest.raises(demo.DemoError, match="choose from single dp ddp zero1 fsdp"):
        demo.parse_modes("hsdp")


def test_a_comm_run_without_the_collective_is_one_line_naming_it_and_the_backend(tmp_path) -> None:
    from analysis.project.sharded import collective_models
    from analysis.project.sharded_inputs import ShardedInputs

    inp = ShardedInputs(
        run_id="f", path="f", strategy="fsdp", backend="gloo", device_type="cpu", world_size=2,
        scaling="strong", per_device_batch=8, global_batch=16, step_time_s=1.0,
        phases_s={}, compute_phases_s={}, other_s=0.0, step_samples_s=np.ones(2), compute_s=1.0,
        algorithms={"all_gather": "all_gather", "reduce_scatter": "all_reduce"},
    )  # fmt: skip
    comm = {"backend": "gloo", "models": {"all_reduce": {}}, "skipped": [
        {"collective": "all_gather_into_tensor", "reason": "RuntimeError: not supported"}]}  # fmt: skip
    with pytest.raises(InputError) as err:
        collective_models(inp, comm, tmp_path, "fit")
    text = str(err.value)
    assert "has no all_gather_into_tensor fit" in text and "on gloo" in text
    assert "gloo lacks it: RuntimeError: not supported" in text and "\n" not in text
