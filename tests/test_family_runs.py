"""Issue 30 end to end: FSDP2 and ZeRO-1 runs of `mlp` and `gpt` on 2 real gloo ranks through the
real launcher (torchrun), against the session's single and DDP runs: the same losses (within
1e-5, fp32: FSDP2 sums the gradients in another order), the static memory counted from the real
shards against a hand computation, the all-gathers and reduce-scatters in the traces with their
bytes, the report's family tables and verdict line, the projection; and a user's model by import
path under FSDP2 with `--fsdp-wrap`; the make targets' flags. Tiny models, few steps."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analysis.project.sharded import project_any
from analysis.report.build import build_report
from analysis.trace.folder import analyze_trace_dir
from tests.conftest import REPO, TINY, launch, read_run

pytestmark = pytest.mark.integration
LOSS_TOL = 1e-5  # fp32, docs/guides/fsdp.md: FSDP2 reduces gradients in another order
GLOO2 = ["--nproc", "2", "--backend", "gloo"]
GPT = ["--model", "gpt", "--model-args", "n_layer=2,n_embd=16,n_head=2,block_size=9",
       "--dataset", "tokens", "--dataset-args", "vocab_size=37,seq_len=9,num_train=64,num_test=16",
       "--max-steps", "3", "--warmup-steps", "1", "--batch-size", "8", "--device", "cpu",
       "--no-profile", "--seed", "0"]  # fmt: skip
MIB_W1 = 3072 * 256 * 4  # the MLP's first weight: ZeRO-1 gives it (and its momentum) to rank 0


def _losses(run: Path) -> dict[tuple[int, int], float]:
    with open(run / "steps.csv", newline="") as f:
        return {(int(r["rank"]), int(r["step"])): float(r["loss"]) for r in csv.DictReader(f)}


def _same_losses(a: Path, b: Path) -> None:
    la, lb = _losses(a), _losses(b)
    assert la.keys() == lb.keys() and la
    worst = max(abs(la[k] - lb[k]) for k in la)
    assert worst <= LOSS_TOL, f"{b.name} vs {a.name}: loss differs by {worst:.2e}"
    ea, eb = (read_run(r)["eval"]["best"]["test_loss"] for r in (a, b))
    assert abs(ea - eb) <= LOSS_TOL


@pytest.fixture(scope="module")
def fsdp_mlp(runs_dir: Path) -> Path:
    """An FSDP2 run of the session runs' workload (TINY: mlp, 8 profiled steps, batch 64)."""
    launch(["--mode", "fsdp", *GLOO2, "--run-id", "fsdp-mlp", "--runs-dir", str(runs_dir), *TINY])
    return runs_dir / "fsdp-mlp"


@pytest.fixture(scope="module")
def zero1_mlp(runs_dir: Path) -> Path:
    """A ZeRO-1 run of the same workload."""
    zero = ["--mode", "ddp", "--zero", "1", *GLOO2]
    launch([*zero, "--run-id", "zero1-mlp", "--runs-dir", str(runs_dir), *TINY])
    return runs_dir / "zero1-mlp"


@pytest.fixture(scope="module")
def family(single_mlp_run: Path, ddp_mlp_run: Path, fsdp_mlp: Path, zero1_mlp: Path) -> dict:
    """The session's single and DDP MLP runs beside the FSDP2 and ZeRO-1 ones."""
    return {"single": single_mlp_run, "ddp": ddp_mlp_run, "fsdp": fsdp_mlp, "zero1": zero1_mlp}


def test_fsdp_trains_the_mlp_as_ddp_does(ddp_mlp_run: Path, fsdp_mlp: Path) -> None:
    _same_losses(ddp_mlp_run, fsdp_mlp)
    fsdp = read_run(fsdp_mlp)["config"]
    assert (fsdp["mode"], fsdp["zero"], fsdp["fsdp"]) == (
        "fsdp", 0, {"wrap": "default", "reshard_after_forward": True})  # fmt: skip


def test_zero1_trains_the_mlp_as_ddp_does(ddp_mlp_run: Path, zero1_mlp: Path) -> None:
    _same_losses(ddp_mlp_run, zero1_mlp)
    assert read_run(zero1_mlp)["config"]["zero"] == 1


def test_fsdp_evaluates_as_the_single_run(single_mlp_run: Path, fsdp_mlp: Path) -> None:
    single = read_run(single_mlp_run)["eval"]["best"]["test_loss"]
    assert abs(read_run(fsdp_mlp)["eval"]["best"]["test_loss"] - single) <= LOSS_TOL


def test_fsdp_on_one_rank_runs_and_trains_as_the_single_run(
    runs_dir: Path, single_mlp_run: Path
) -> None:
    """`--mode fsdp --nproc 1` is allowed (docs/guides/fsdp.md): one torchrun rank whose shards
    are whole tensors, the single run's losses, no gathered peak above the model."""
    fsdp1 = ["--mode", "fsdp", "--nproc", "1", "--backend", "gloo", "--run-id", "fsdp1-mlp"]
    launch([*fsdp1, "--runs-dir", str(runs_dir), *TINY])
    run = runs_dir / "fsdp1-mlp"
    _same_losses(single_mlp_run, run)
    rec = read_run(run)
    assert (rec["config"]["mode"], rec["config"]["world_size"]) == ("fsdp", 1)
    params = sum((i * o + o) * 4 for i, o in ((3072, 256), (256, 256), (256, 10)))
    (e,) = rec["metrics"]["memory_breakdown"]
    assert e["parameters_bytes"] == e["gradients_bytes"] == e["optimizer_state_bytes"] == params
    assert e["fsdp_unsharded_peak_bytes"] <= params


def test_sharded_static_memory_of_the_mlp_by_hand(family: dict[str, Path]) -> None:
    """256 and 10 rows split evenly over 2 ranks: FSDP2's shards are exactly half of every
    tensor; the gathered peak is block 1 and block 2 (block 2 gathered, block 1 prefetched in
    backward); ZeRO-1 keeps DDP's parameters, gradients and buckets and splits the momentum by
    whole parameters, largest first (rank 0: the first weight; rank 1: the rest)."""
    params = sum((i * o + o) * 4 for i, o in ((3072, 256), (256, 256), (256, 10)))
    fsdp = read_run(family["fsdp"])["metrics"]
    for e in fsdp["memory_breakdown"]:
        assert e["parameters_bytes"] == e["gradients_bytes"] == e["optimizer_state_bytes"]
        assert e["parameters_bytes"] == params // 2 and e["ddp_buckets_bytes"] == 0
        assert e["fsdp_unsharded_peak_bytes"] == (3072 * 256 + 256 + 256 * 256 + 256) * 4
    groups = fsdp["fsdp"]["groups"]
    assert [g["module"] for g in groups] == ["1", "3", "5"]
    assert sum(g["unsharded_bytes"] for g in groups) == params
    zero = {e["rank"]: e for e in read_run(family["zero1"])["metrics"]["memory_breakdown"]}
    for e in zero.values():
        assert e["parameters_bytes"] == e["gradients_bytes"] == e["ddp_buckets_bytes"] == params
    assert zero[0]["optimizer_state_bytes"] == MIB_W1
    assert zero[1]["optimizer_state_bytes"] == params - MIB_W1


def test_all_gathers_and_reduce_scatters_in_the_traces(family: dict[str, Path]) -> None:
    trace = analyze_trace_dir(family["fsdp"] / "traces", progress=False)
    rows = {c["name"]: c for c in trace["collectives"]}
    steps = trace["ranks"][0]["steps"]
    params = sum((i * o + o) * 4 for i, o in ((3072, 256), (256, 256), (256, 10)))
    ag, rs = rows["gloo:all_gather"], rows["gloo:reduce_scatter"]
    assert rs["algorithm"] == "gloo:all_reduce" and ag["algorithm"] == "gloo:all_gather"
    by_phase = {p["phase"]: p for p in ag["phases"]}
    for phase in ("forward", "backward"):  # each block gathered before forward and backward
        assert by_phase[phase]["calls"] == 3 * steps
        assert by_phase[phase]["bytes_total"] == params * steps  # nccl-tests: the output
        assert by_phase[phase]["busbw_gbps"] > 0
    (back,) = rs["phases"]
    assert back["phase"] == "backward" and back["bytes_total"] == params * steps
    assert back["exposed_us_total"] + back["overlapped_us_total"] > 0
    zero = {
        c["name"]: c
        for c in analyze_trace_dir(family["zero1"] / "traces", progress=False)["collectives"]
    }
    (opt,) = zero["gloo:broadcast"]["phases"]  # each parameter from its owner, after its step
    assert opt["phase"] == "optimizer" and opt["calls"] == 6 * steps


def test_report_compares_the_family_and_projects_it(
    family: dict[str, Path], comm_run: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    for run in [*family.values(), comm_run]:
        shutil.copytree(run, runs / run.name)
    index = build_report([runs], tmp_path / "report", progress=False).index_html
    summary = json.loads((index.parent / "summary.json").read_text())
    sharded = {p.get("strategy"): p for p in summary["projections"] if p.get("strategy")}
    assert set(sharded) == {"fsdp", "zero1"}, summary["projection_skipped"]
    for p in sharded.values():  # banded like DDP's, replayed from each run
        assert all(x["step_time_s_low"] <= x["step_time_s"] <= x["step_time_s_high"]
                   for x in p["predictions"])  # fmt: skip
        assert [r["ranks"] for r in p["replays"]] == [2]
    html = index.read_text(encoding="utf-8")
    verdict = html[html.index('id="verdict"') : html.index('id="summary"')]
    assert "ZeRO-1 saves" in verdict and "FSDP2 saves" in verdict
    assert "Largest model that fits" in verdict
    # The throughput share only where the group's throughput is not known noise (a busy machine)
    (ddp,) = [g for g in summary["groups"] if g["strategy"] == "ddp" and g["world_size"] == 2]
    assert ("of DDP&#39;s throughput" in verdict) == (not ddp["noisy_run_ids"]), verdict
    for csv_name in ("family.csv", "capacity.csv", "collective_phases.csv"):
        assert (index.parent / csv_name).read_text().count("\n") >= 3
    assert 'id="family"' in html and 'id="collective-phases"' in html
    result = project_any(family["fsdp"], comm_run, [2, 4, 8])
    assert result["inputs"]["algorithms"] == {
        "all_gather": "all_gather",
        "reduce_scatter": "all_reduce",
    }
    assert math.isfinite(result["replay"]["error_pct"])
    assert [p["ranks"] for p in result["predictions"]] == [2, 4, 8]


def _padded_shards(model: torch.nn.Module) -> tuple[int, list[int]]:
    """Per rank of 2: the padded shard bytes of every parameter (dim 0 in 2 chunks, the first's
    size on both), and each rank's real chunk bytes (torch.chunk: ceil, then the rest)."""
    padded, real = 0, [0, 0]
    for p in model.parameters():  # tied weights once
        rows, rest = p.shape[0], p[0].numel()
        first = math.ceil(rows / 2)
        padded += first * rest * 4
        real[0] += first * rest * 4
        real[1] += (rows - first) * rest * 4
    return padded, real


def _gpt(runs_dir: Path, name: str, mode: list[str]) -> Path:
    launch([*mode, *GLOO2, "--run-id", f"{name}-gpt", "--runs-dir", str(runs_dir), *GPT])
    return runs_dir / f"{name}-gpt"


@pytest.fixture(scope="module")
def gpt_ddp(runs_dir: Path) -> Path:
    return _gpt(runs_dir, "ddp", ["--mode", "ddp"])


def test_gpt_under_fsdp_trains_as_ddp_with_padded_shards(runs_dir: Path, gpt_ddp: Path) -> None:
    fsdp = _gpt(runs_dir, "fsdp", ["--mode", "fsdp"])
    _same_losses(gpt_ddp, fsdp)
    from workloads.train.gpt import gpt

    padded, real = _padded_shards(gpt(num_classes=37, n_layer=2, n_embd=16, n_head=2, block_size=9))
    entries = {e["rank"]: e for e in read_run(fsdp)["metrics"]["memory_breakdown"]}
    for rank, e in entries.items():  # 37 tokens and 9 positions do not split evenly: padding
        assert e["parameters_bytes"] == e["gradients_bytes"] == padded
        assert e["optimizer_state_bytes"] == real[rank]  # momentum: the real chunk, no padding
    groups = read_run(fsdp)["metrics"]["fsdp"]["groups"]
    assert [g["module"] for g in groups] == ["", "blocks.0", "blocks.1"]


def test_gpt_under_zero1_trains_as_ddp(runs_dir: Path, gpt_ddp: Path) -> None:
    _same_losses(gpt_ddp, _gpt(runs_dir, "zero1", ["--mode", "ddp", "--zero", "1"]))


NETS = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class Net(nn.Module):
    """Blocks in a ModuleDict: the default wrap rule finds none, --fsdp-wrap names them."""

    def __init__(self, num_classes):
        super().__init__()
        self.inp = nn.Linear(12, 24)
        self.stages = nn.ModuleDict({"a": Block(24), "b": Block(24)})
        self.out = nn.Linear(24, num_classes)

    def forward(self, x):
        x = self.inp(x.flatten(1))
        return self.out(self.stages["b"](self.stages["a"](x)))


def net(num_classes):
    return Net(num_classes)


def blobs():
    g = torch.Generator().manual_seed(5)
    y = torch.randint(3, (96,), generator=g)
    x = torch.randn(96, 12, generator=g) + y[:, None]
    return TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])
'''


def _launch_in(folder: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "workloads.launch", *args]
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(600)  # two torchrun jobs and a refused launch
def test_user_model_by_import_path_under_fsdp(tmp_path: Path) -> None:
    (tmp_path / "famnets").mkdir()
    (tmp_path / "famnets" / "__init__.py").write_text("")
    (tmp_path / "famnets" / "nets.py").write_text(NETS)
    user = ["--model", "famnets.nets:net", "--dataset", "famnets.nets:blobs", "--max-steps", "2",
            "--warmup-steps", "1", "--batch-size", "16", "--device", "cpu", "--no-profile"]  # fmt: skip
    bad = _launch_in(tmp_path, ["--mode", "fsdp", *GLOO2, *user, "--fsdp-wrap", "torch.nn:Conv2d"])
    assert bad.returncode == 2 and not (tmp_path / "runs").exists()
    assert bad.stderr.strip().count("\n") == 0
    assert "--fsdp-wrap torch.nn:Conv2d: the model (Net) contains no Conv2d" in bad.stderr
    for mode, rid in ((["--mode", "fsdp", *GLOO2, "--fsdp-wrap", "famnets.nets:Block"], "f"),
                      (["--mode", "ddp", *GLOO2], "d")):  # fmt: skip
        proc = _launch_in(tmp_path, [*mode, *user, "--run-id", rid])
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = read_run(tmp_path / "runs" / "f")
    assert run["config"]["fsdp"]["wrap"] == "famnets.nets:Block"
    assert [g["module"] for g in run["metrics"]["fsdp"]["groups"]] == ["", "stages.a", "stages.b"]
    assert run["config"]["model"] == "famnets.nets:net"
    _same_losses(tmp_path / "runs" / "d", tmp_path / "runs" / "f")


def test_make_targets_pass_the_family_flags(tmp_path: Path) -> None:
    """`make profile-fsdp`, `profile-zero1` and `profile-all MODES=...` as a user types them;
    PY is a script that prints its arguments, so make and the shell really run each recipe."""
    argv = tmp_path / "argv.py"
    argv.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    argv.chmod(0o755)

    def make(*args: str) -> list[list[str]]:
        cmd = ["make", "-s", "-o", ".venv/.requirements.stamp", f"PY={argv}", *args]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line)[2:] for line in proc.stdout.splitlines()]  # after -m cli

    (fsdp,) = make("profile-fsdp", "FSDP_WRAP=mypkg.nets:Block", "RESHARD=false", "NPROC=2")
    assert fsdp[:3] == ["profile", "--mode", "fsdp"] and "--nproc" in fsdp
    assert fsdp[fsdp.index("--fsdp-wrap") + 1] == "mypkg.nets:Block"
    assert fsdp[fsdp.index("--fsdp-reshard-after-forward") + 1] == "false"
    (zero,) = make("profile-zero1")
    assert zero[:5] == ["profile", "--mode", "ddp", "--zero", "1"]
    calls = make("profile-all", "MODES=single ddp zero1 fsdp", "SEEDS=0 1")
    modes = [(c[c.index("--mode") + 1], "--zero" in c, c[c.index("--seed") + 1]) for c in calls]
    assert modes == [("all", False, "0"), ("ddp", True, "0"), ("fsdp", False, "0"),
                     ("all", False, "1"), ("ddp", True, "1"), ("fsdp", False, "1")]  # fmt: skip
