"""Truth checks of the memory breakdown (issue 11): static bytes against Σ numel × 4 of the real
MLP, DDP's buckets against the gradients (with and without gradient-as-bucket-view), the forward
peak against activation bytes computed by hand, and hand-built [memory] event cases."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis.runs.compare import compare_runs
from analysis.trace.folder import analyze_trace_dir
from analysis.trace.loader import Event
from analysis.trace.memory import MemoryAccumulator, downsample, memory_summary
from tests.conftest import TINY, launch, read_run
from workloads.train.models import build_model

MLP = build_model("mlp", num_classes=10)
PARAM_BYTES = sum(p.numel() * 4 for p in MLP.parameters())  # fp32: 4 bytes per element
HIDDEN = MLP[1].out_features


def _breakdown(run_dir: Path) -> list[dict]:
    return read_run(run_dir)["metrics"]["memory_breakdown"]


def test_static_counts_match_the_model(single_mlp_run: Path, ddp_mlp_run: Path) -> None:
    assert read_run(single_mlp_run)["config"]["momentum"] > 0  # SGD keeps one momentum buffer
    for run_dir, ranks in ((single_mlp_run, [0]), (ddp_mlp_run, [0, 1])):
        entries = _breakdown(run_dir)
        assert [(e["rank"], e["device"]) for e in entries] == [(r, "cpu") for r in ranks]
        for e in entries:
            assert e["parameters_bytes"] == PARAM_BYTES == 3_420_200
            assert e["gradients_bytes"] == PARAM_BYTES
            assert e["optimizer_state_bytes"] == PARAM_BYTES
            assert e["buffers_bytes"] == 0  # the MLP has no BatchNorm
            assert e["static_total_bytes"] == sum(
                e[k]
                for k in (
                    "parameters_bytes",
                    "gradients_bytes",
                    "optimizer_state_bytes",
                    "buffers_bytes",
                    "ddp_buckets_bytes",
                )
            )
    assert _breakdown(single_mlp_run)[0]["ddp_buckets_bytes"] == 0
    for e in _breakdown(ddp_mlp_run):
        # DDP copies gradients into flat buckets of its own: about the gradients again.
        assert e["ddp_buckets_bytes"] == pytest.approx(e["gradients_bytes"], rel=0.05)


def test_gradient_as_bucket_view_removes_the_buckets(runs_dir: Path) -> None:
    run_id = "ddp-gloo-mlp-view"
    args = ["--mode", "ddp", "--nproc", "2", "--backend", "gloo", "--run-id", run_id]
    launch(
        [
            *args,
            "--runs-dir",
            str(runs_dir),
            *TINY,
            "--max-steps",
            "3",
            "--no-profile",
            "--gradient-as-bucket-view",
        ]
    )
    for e in _breakdown(runs_dir / run_id):
        assert e["ddp_buckets_bytes"] == 0
        assert e["gradients_bytes"] == PARAM_BYTES  # the grads are views of the bucket storage


def test_bucket_sharing_is_read_from_storage_pointers(tmp_path: Path) -> None:
    """In one real gloo process group: DDP's grads share one storage per bucket only with the
    view, which is what the counter keys on."""
    import torch.distributed as dist

    from profiler.memory_breakdown import StaticMemory, storage_key

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        for view in (False, True):
            torch.manual_seed(0)
            model = torch.nn.parallel.DistributedDataParallel(
                build_model("mlp", num_classes=10), gradient_as_bucket_view=view
            )
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            static = StaticMemory(rank=0, devices=[torch.device("cpu")], planned_steps=3)
            for step in range(3):
                model(torch.randn(4, 3, 32, 32)).sum().backward()
                static.after_backward(model, step)
                if step == 1:
                    storages = {storage_key(p.grad) for p in model.parameters()}
                opt.step()
                opt.zero_grad(set_to_none=True)
                static.after_optimizer(model, opt, step)
            (entry,) = static.entries()
            n_params = len(list(model.parameters()))
            assert len(storages) == (
                len(model.reducer._get_zeros_like_grad_buckets()) if view else n_params
            )
            assert entry["ddp_buckets_bytes"] == (0 if view else PARAM_BYTES)
            assert entry["counted_at_step"] == 1
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("fixture, batch", [("single_mlp_run", 64), ("ddp_mlp_run", 32)])
@pytest.mark.integration
def test_forward_peak_matches_hand_count(request, fixture: str, batch: int) -> None:
    """The MLP's forward peak is when the second ReLU writes its output: the first ReLU's output
    (saved by Linear 2), Linear 2's output (ReLU's input) and the new output are alive, each
    batch × hidden × 4 bytes (Linear 1's output was freed once ReLU 1 had consumed it)."""
    run_dir = request.getfixturevalue(fixture)
    hand = 3 * batch * HIDDEN * 4
    (run,) = compare_runs([run_dir], progress=False)["runs"]
    assert run["memory_breakdown"]
    for e in run["memory_breakdown"]:
        assert e["forward_peak_bytes"] == pytest.approx(hand, rel=0.10)
        # backward creates the gradients (zero_grad(set_to_none=True) freed them): at least those
        assert e["backward_peak_bytes"] >= e["gradients_bytes"]
        assert e["optimizer_peak_bytes"] > 0


def _strip_memory_events(src: Path, dst: Path) -> None:
    data = json.loads(gzip.decompress(src.read_bytes()))
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("name") != "[memory]"]
    dst.write_bytes(gzip.compress(json.dumps(data).encode()))


def test_trace_without_memory_events_warns(single_mlp_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "single-nomem"
    shutil.copytree(single_mlp_run, run_dir)
    for trace in (run_dir / "traces").iterdir():
        _strip_memory_events(trace, trace)
    traces = analyze_trace_dir(run_dir / "traces", progress=False)
    assert any("no [memory] events" in w for w in traces["warnings"])
    (run,) = compare_runs([run_dir], progress=False)["runs"]
    (entry,) = run["memory_breakdown"]
    assert entry["parameters_bytes"] == PARAM_BYTES  # the static count is still there
    assert entry["forward_peak_bytes"] is None and entry["optimizer_peak_bytes"] is None
    assert any("profile_memory off" in w for w in run["warnings"])


def _mem(ts: float, nbytes: int, total: int, device_type: int = 0, device_id: int = -1) -> Event:
    args = {
        "Total Allocated": total,
        "Bytes": nbytes,
        "Device Type": device_type,
        "Device Id": device_id,
    }
    return Event(
        ph="i", cat="cpu_instant_event", name="[memory]", ts=ts, args=json.dumps(args).encode()
    )


def _phase(name: str, ts: float, dur: float) -> Event:
    return Event(ph="X", cat="user_annotation", name=name, ts=ts, dur=dur)


def test_phase_peaks_on_hand_built_events() -> None:
    """Two steps; the level before the first event comes from its Bytes; CPU and CUDA apart."""
    acc = MemoryAccumulator()
    acc.add(
        [
            _phase("forward", 10, 10),
            _phase("backward", 20, 10),
            _phase("optimizer", 30, 5),
            _mem(12, 100, 1100),  # level before: 1000
            _mem(15, 50, 1150),
            _mem(18, -50, 1100),
            _mem(22, 300, 1400),
            _mem(28, -400, 1000),
            _mem(32, 20, 1020),
            _mem(33, -20, 1000),
            _phase("forward", 40, 10),
            _phase("backward", 50, 10),
            _phase("optimizer", 60, 5),
            _mem(45, 70, 1070),
            _mem(55, 500, 1570),
            _mem(58, -570, 1000),
            Event(ph="X", cat="gpu_user_annotation", name="forward", ts=26, dur=30),  # ignored
            _mem(14, 4096, 8192, 1, 0),  # a CUDA device: its own curve
            _mem(24, 1024, 9216, 1, 0),
        ]
    )
    out = memory_summary(acc.finish(0.0), "hand")
    assert out["warnings"] == []
    cpu, cuda = out["devices"]
    assert (cpu["device"], cuda["device"]) == ("cpu", "cuda:0")
    # step 1 (base 1000): forward 150, backward 400; optimizer: max(level at start 1000, 1020)
    # step 2 (base 1000): forward 70, backward 570 (level at start 1070 is lower)
    assert [s["forward_peak_bytes"] for s in cpu["per_step"]] == [150, 70]
    assert [s["backward_peak_bytes"] for s in cpu["per_step"]] == [400, 570]
    assert [s["optimizer_peak_bytes"] for s in cpu["per_step"]] == [20, 0]
    assert (cpu["forward_peak_bytes"], cpu["backward_peak_bytes"], cpu["optimizer_peak_bytes"]) == (
        150,
        570,
        20,
    )
    assert cuda["per_step"][0]["start_level_bytes"] == 4096
    assert cuda["forward_peak_bytes"] == 4096 and cuda["backward_peak_bytes"] == 5120


def test_no_memory_events_and_no_phases() -> None:
    acc = MemoryAccumulator()
    acc.add([_phase("forward", 0, 1)])
    out = memory_summary(acc.finish(0.0), "t.json")
    assert out["devices"] == [] and "no [memory] events" in out["warnings"][0]
    acc = MemoryAccumulator()
    acc.add([_mem(1, 8, 8)])
    out = memory_summary(acc.finish(0.0), "t.json")
    assert out["devices"][0]["forward_peak_bytes"] is None
    assert "no forward/backward/optimizer ranges" in out["warnings"][0]


def test_downsample_keeps_the_extremes() -> None:
    rng = np.random.default_rng(0)
    t = np.arange(100_000, dtype=float)
    y = rng.integers(0, 1000, t.size)
    y[54_321] = 10_000
    ts, ys = downsample(t, y, points=500)
    assert ts.size <= 502 and ys.max() == 10_000 and ys.min() == y.min()
    assert np.all(np.diff(ts) > 0) and ts[0] == 0 and ts[-1] == t[-1]


def test_buffers_and_shared_storage_are_counted_once() -> None:
    """smallcnn's BatchNorm statistics are buffers; a weight tied to two modules is one storage;
    Adam's moments (and its step counters) are optimizer state."""
    from profiler.memory_breakdown import StaticMemory

    torch.manual_seed(0)
    model = build_model("smallcnn", num_classes=10)
    tied = torch.nn.Sequential(model, torch.nn.Linear(10, 10, bias=False))
    tied.append(torch.nn.Linear(10, 10, bias=False))
    tied[2].weight = tied[1].weight  # one storage reached twice
    opt = torch.optim.Adam(tied.parameters(), lr=1e-3)
    static = StaticMemory(rank=0, devices=[torch.device("cpu")], planned_steps=1)
    tied(torch.randn(2, 3, 32, 32)).sum().backward()
    static.after_backward(tied, 0)
    opt.step()
    static.after_optimizer(tied, opt, 0)
    (e,) = static.entries()
    params = {id(p): p for p in tied.parameters()}.values()  # parameters() already dedups ties
    param_bytes = sum(p.numel() * 4 for p in params)
    assert e["parameters_bytes"] == param_bytes
    assert e["gradients_bytes"] == param_bytes
    assert e["buffers_bytes"] == sum(b.numel() * b.element_size() for b in tied.buffers()) > 0
    steps = sum(s["step"].numel() * s["step"].element_size() for s in opt.state.values())
    assert e["optimizer_state_bytes"] == 2 * param_bytes + steps
    assert e["ddp_buckets_bytes"] == 0 and e["counted_at_step"] == 0


def test_parameters_viewing_one_storage_count_it_once() -> None:
    """Two distinct Parameters that are views of one flat tensor (as DDP's bucket views or a
    flattened model make them): the storage's bytes, once."""
    from profiler.memory_breakdown import StaticMemory

    flat = torch.zeros(30)
    module = torch.nn.Module()
    module.a = torch.nn.Parameter(flat[:10])
    module.b = torch.nn.Parameter(flat[10:])
    assert module.a.untyped_storage().data_ptr() == module.b.untyped_storage().data_ptr()
    static = StaticMemory(rank=0, devices=[torch.device("cpu")], planned_steps=1)
    static.after_backward(module, 0)  # no gradients yet: none counted
    static.after_optimizer(module, torch.optim.SGD(module.parameters(), lr=0.1), 0)
    (e,) = static.entries()
    assert e["parameters_bytes"] == 30 * 4 and e["gradients_bytes"] == 0


def test_malformed_breakdown_in_run_json_is_dropped_not_fatal() -> None:
    from analysis.trace.memory import breakdown_entries, fill_dynamic

    assert breakdown_entries("junk") == [] and breakdown_entries(None) == []
    entries = breakdown_entries(
        [{"rank": 0, "device": "cpu", "parameters_bytes": "12", "gradients_bytes": True}, 7, {}]
    )
    assert len(entries) == 1 and entries[0]["parameters_bytes"] is None
    assert entries[0]["gradients_bytes"] is None and entries[0]["forward_peak_bytes"] is None
    # a run folder from before the breakdown: entries come from the trace alone, static null
    ranks = [{"rank": 1, "memory": {"devices": [{"device": "cpu", "forward_peak_bytes": 5}]}}]
    made: list[dict] = []
    assert fill_dynamic(made, ranks) == []
    assert made[0]["rank"] == 1 and made[0]["forward_peak_bytes"] == 5
    assert made[0]["static_total_bytes"] is None


def test_bucket_fallback_uses_ddp_logged_sizes(tmp_path: Path, monkeypatch) -> None:
    """Without the reducer's private bucket call the logged bucket sizes give the same bytes."""
    import torch.distributed as dist

    from profiler.memory_breakdown import StaticMemory

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(build_model("mlp", num_classes=10))
        static = StaticMemory(rank=0, devices=[torch.device("cpu")], planned_steps=1)
        assert static._ddp_extra_from_logging(model) == {"cpu": PARAM_BYTES}
        model.gradient_as_bucket_view = True
        assert static._ddp_extra_from_logging(model) == {}
    finally:
        dist.destroy_process_group()
