"""Issue 22 end to end: real runs through the real launcher (torchrun, gloo) of each spec form,
started from a user's folder outside the repo (the user package of tests/user_pkg.py), and the
report pairing a user model's single and DDP runs. Tiny models, few steps."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from analysis.report.build import build_report
from analysis.runs.compare import compare_runs
from tests.conftest import REPO, read_run
from tests.user_pkg import write_user_package

# One thread per rank: a single-device run with two spinning threads on a busy 2-core machine
# runs a convolution step 30x slower than with one.
CPU = "--epochs 1 --device cpu --seed 3 --threads 1".split()
GPT = [
    "--model",
    "gpt",
    "--model-args",
    "n_layer=1,n_embd=32,n_head=2,block_size=16",
    "--dataset",
    "tokens",
    "--dataset-args",
    "vocab_size=512,seq_len=16,num_train=256,num_test=64",
]
USER = ["--model", "userpkg.nets:tiny_net", "--dataset", "userpkg.nets:blobs"]
pytestmark = pytest.mark.integration  # every test here starts the launcher
DDP = ["--mode", "ddp", "--nproc", "2", "--backend", "gloo"]
SHORT = ["--max-steps", "3", "--warmup-steps", "1", "--no-profile"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The user's folder, outside the repo: userpkg/ and the runs/ the commands write there."""
    return write_user_package(tmp_path_factory.mktemp("project"))


def launch_in(folder: Path, args: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m workloads.launch ARGS` run in `folder`, dpscope on PYTHONPATH (a user's setup)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, "-m", "workloads.launch", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"launcher failed ({proc.returncode})\n{proc.stdout}\n{proc.stderr}")
    return proc


def losses(run_dir: Path) -> dict[int, float]:
    """Per-step loss, the mean over ranks."""
    per_step: dict[int, list[float]] = {}
    with open(run_dir / "steps.csv", newline="") as f:
        for row in csv.DictReader(f):
            per_step.setdefault(int(row["step"]), []).append(float(row["loss"]))
    return {s: sum(v) / len(v) for s, v in sorted(per_step.items())}


def by_mode(runs_dir: Path) -> dict[str, dict]:
    runs = [read_run(d) for d in sorted(runs_dir.iterdir()) if (d / "run.json").is_file()]
    return {f"{r['config']['mode']}-{r['config']['backend']}": r for r in runs}


# --- gpt / tokens: every mode this machine runs ------------------------------------------------


def _launches(project: Path) -> dict[str, list[str]]:
    """Every launch of this module: {name: launcher arguments}, each into its own runs folder."""
    gpt = ["--mode", "all", *GPT, "--bucket-cap-mb", "0.05", "--batch-size", "16"]
    tv = ["--mode", "all", "--nproc", "2", "--model", "torchvision:mobilenet_v3_small"]
    tv += ["--dataset", "userpkg.nets:images", "--batch-size", "16", *SHORT]
    user = [*USER, "--model-args", "hidden=24", "--batch-size", "32", "--max-steps", "12"]
    user += ["--no-profile", "--checkpoint"]
    crash = ["--mode", "single", "--run-id", "crash", "--model", "userpkg.nets:forward_fails"]
    crash += ["--dataset", "userpkg.nets:blobs", "--batch-size", "16", *SHORT]
    no_test = ["--mode", "single", "--run-id", "no-test", "--model", "userpkg.nets:tiny_net"]
    no_test += ["--dataset", "userpkg.nets:blobs_no_test", "--batch-size", "32", *SHORT]
    launches = {
        "gpt-runs": [*gpt, "--max-steps", "8"],
        "tv-runs": tv,
        "user-runs": ["--mode", "single", "--run-id", "user-single", *user],
        "user-runs-ddp": [*DDP, "--run-id", "user-ddp", *user],
        "crash-runs": crash,
        "no-test-runs": no_test,
    }
    folder = {"user-runs-ddp": "user-runs"}  # the user pair shares one folder
    return {
        name: [*args, *CPU, "--runs-dir", str(project / folder.get(name, name))]
        for name, args in launches.items()
    }


@pytest.fixture(scope="module")
def launched(project) -> dict[str, subprocess.CompletedProcess]:
    """Every launch of this module started at once (each mostly waits on one core: two cores
    finish them sooner together), {name: the finished launcher}."""
    with ThreadPoolExecutor(max_workers=len(_launches(project))) as pool:
        futures = {
            name: pool.submit(launch_in, project, args, check=False)
            for name, args in _launches(project).items()
        }
    return {name: future.result() for name, future in futures.items()}


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"launcher failed ({proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    )


@pytest.fixture(scope="module")
def gpt_runs(project, launched) -> Path:
    """`--mode all` of a tiny gpt on tokens, profiled: single and ddp-gloo run here; dp and
    ddp-nccl are skipped without CUDA (or run, where there is one). 0.05 MiB buckets: DDP (and
    the projection) put the 64 KiB tied embedding in a bucket of its own, the last."""
    _ok(launched["gpt-runs"])
    return project / "gpt-runs"


def test_gpt_runs_in_every_mode_and_trains_identically(gpt_runs):
    runs = by_mode(gpt_runs)
    assert runs["single-none"]["status"] == runs["ddp-gloo"]["status"] == "ok"
    for key in ("dp-none", "ddp-nccl"):  # what this machine cannot run is said, in one line
        if runs[key]["status"] == "skipped":
            assert "CUDA" in runs[key]["error"]["message"]
        else:
            assert runs[key]["status"] == "ok"
    single = losses(gpt_runs / runs["single-none"]["run_id"])
    ddp = losses(gpt_runs / runs["ddp-gloo"]["run_id"])
    assert sorted(single) == sorted(ddp) == list(range(8))
    for step, loss in single.items():  # no BatchNorm, no dropout: the same training
        assert ddp[step] == pytest.approx(loss, abs=1e-5), step
    assert single[7] < single[0] < math.log(512) + 0.1  # starts near ln(vocab) and falls


def test_gpt_records_its_workload_and_sequence_eval(gpt_runs):
    from workloads.train.models import build_model

    runs = by_mode(gpt_runs)
    net = build_model(
        "gpt",
        num_classes=512,
        model_args={"n_layer": 1, "n_embd": 32, "n_head": 2, "block_size": 16},
    )
    params = sum(p.numel() for p in net.parameters())  # the tied matrix once
    for key, batch in (("single-none", 16), ("ddp-gloo", 8)):
        config = runs[key]["config"]
        assert config["model_args"] == {"n_layer": 1, "n_embd": 32, "n_head": 2, "block_size": 16}
        assert config["dataset_args"]["vocab_size"] == 512 and config["loss"] == "cross_entropy"
        assert config["model_facts"] == {
            "parameters": params,
            "trainable_parameters": params,
            "num_classes": 512,
            "has_test_split": True,
            "input_shape": [batch, 16],
            "input_dtype": "int64",
            "target_shape": [batch, 16],
            "target_dtype": "int64",
        }
        best = runs[key]["eval"]["best"]
        assert best["output"] == "sequence" and best["top5_pct"] is None
        assert best["tokens"] == 64 * 16 and best["samples"] == 64
        assert best["perplexity"] == pytest.approx(math.exp(best["test_loss"]), rel=1e-9)
    single, ddp = runs["single-none"]["eval"]["best"], runs["ddp-gloo"]["eval"]["best"]
    assert ddp["test_loss"] == pytest.approx(single["test_loss"], abs=1e-5)


def test_gpt_buckets_as_ddp_made_them(gpt_runs):
    """The tied embedding/head is registered first, so it is in the last bucket DDP makes; the
    projection's bucket assignment of the single run must give the DDP run's real buckets."""
    from analysis.project.model import ddp_buckets

    runs = by_mode(gpt_runs)
    ddp = runs["ddp-gloo"]["metrics"]
    single = runs["single-none"]
    first = single["config"]["ddp"]["first_bucket_bytes"]
    assert first == 52428  # this torch: an explicit cap is the first bucket's limit too
    computed = ddp_buckets(single["metrics"]["param_grad_bytes"], 0.05, first)
    embedding_bytes = 512 * 32 * 4
    assert ddp["param_grad_bytes"][0] == embedding_bytes  # wte: the first parameter
    # One block, ln_f and wpe fill the first bucket; the tied embedding/head is the last alone.
    assert (
        computed
        == ddp["ddp"]["bucket_sizes_bytes"]
        == [sum(ddp["param_grad_bytes"][1:]), embedding_bytes]
    )


# --- torchvision:NAME and MODULE:FUNCTION, single and DDP -------------------------------------


def test_torchvision_model_by_name_single_and_ddp(project, launched):
    import torchvision

    _ok(launched["tv-runs"])  # --mode all: single and ddp-gloo here
    runs = project / "tv-runs"
    want = sum(
        p.numel() for p in torchvision.models.mobilenet_v3_small(num_classes=10).parameters()
    )
    found = by_mode(runs)
    for key in ("single-none", "ddp-gloo"):
        rec = found[key]
        assert rec["status"] == "ok" and rec["config"]["model"] == "torchvision:mobilenet_v3_small"
        assert rec["config"]["model_facts"]["parameters"] == want
        assert rec["eval"]["best"]["output"] == "class_scores"


@pytest.fixture(scope="module")
def user_runs(project, launched) -> Path:
    """A user factory and dataset from the user's folder, single and DDP-2 (no BatchNorm)."""
    _ok(launched["user-runs"])
    _ok(launched["user-runs-ddp"])
    return project / "user-runs"


def test_user_factory_trains_identically_single_and_ddp(user_runs):
    import torch

    from workloads.train.checkpoint import load_checkpoint

    single, ddp = losses(user_runs / "user-single"), losses(user_runs / "user-ddp")
    assert sorted(single) == sorted(ddp) == list(range(12))
    for step, loss in single.items():
        assert ddp[step] == pytest.approx(loss, abs=1e-5), step
    assert single[11] < single[0]
    a = load_checkpoint(user_runs / "user-single" / "checkpoint.pt")["model"]
    b = load_checkpoint(user_runs / "user-ddp" / "checkpoint.pt")["model"]
    for name, w in a.items():
        torch.testing.assert_close(b[name], w, atol=1e-5, rtol=0)
    config = read_run(user_runs / "user-ddp")["config"]
    assert (config["model"], config["dataset"]) == ("userpkg.nets:tiny_net", "userpkg.nets:blobs")
    assert config["model_args"] == {"hidden": 24}
    assert config["model_facts"]["num_classes"] == 3  # max + 1 of the TensorDataset's targets
    assert config["model_facts"]["input_shape"] == [16, 1, 12]


def test_report_pairs_a_user_models_runs(user_runs, tmp_path):
    data = compare_runs([user_runs], progress=False, traces=False)
    runs = {r["run_id"]: r for r in data["runs"]}
    ddp, single = runs["user-ddp"], runs["user-single"]
    assert ddp["baseline_run_id"] == "user-single" and ddp["speedup"] is not None
    assert (ddp["model"], ddp["model_args"], ddp["loss"]) == (
        "userpkg.nets:tiny_net",
        "hidden=24",
        "cross_entropy",
    )
    assert ddp["top1_pct"] == pytest.approx(single["top1_pct"], abs=1e-6)
    files = build_report([user_runs], tmp_path / "report", progress=False)
    html = files.index_html.read_text()
    assert "userpkg.nets:tiny_net" in html
    assert "held accuracy" in html  # the DDP group compared with its own single baseline


# --- what is not caught before the run, and a dataset without a test split ---------------------


def test_a_forward_that_fails_is_a_crash_with_its_message(project, launched):
    runs, proc = project / "crash-runs", launched["crash-runs"]
    assert proc.returncode == 1
    rec = read_run(runs / "crash")
    assert rec["status"] == "failed" and rec["error"]["kind"] == "crash"
    assert "user forward is broken on purpose" in rec["error"]["message"]
    assert rec["config"]["model_facts"]["parameters"] == 12 * 3 + 3  # recorded before it ran


def test_no_test_split_means_no_eval_and_the_report_says_so(project, launched, tmp_path):
    runs = project / "no-test-runs"
    _ok(launched["no-test-runs"])
    rec = read_run(runs / "no-test")
    assert rec["status"] == "ok" and rec["config"]["model_facts"]["has_test_split"] is False
    assert rec["eval"] == {
        "epochs": [],
        "best": None,
        "note": "--dataset userpkg.nets:blobs_no_test has no test split",
        "split_samples": None,  # no test split to size
    }
    files = build_report([runs], tmp_path / "report", progress=False)
    assert (
        "No eval in 1 run(s), so no accuracy to compare: --dataset" in files.index_html.read_text()
    )
