"""`--script`: real training scripts written as users write them (tests/scripts/), copied to a
folder outside the repository and profiled unedited in single and DDP (gloo, 2 ranks) mode; and
RunRecorder driven in-process by hand (docs/guides/own-script.md)."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from analysis.report.scaling import group_labels, scaling_frame
from analysis.report.verdict import verdict
from analysis.runs.compare import compare_runs
from tests.conftest import read_run
from tests.script_common import ok, profile, steps, user_folder
from workloads.launch import launcher

pytestmark = pytest.mark.integration  # every test here starts the launcher or a script

_profile, _ok, _steps = profile, ok, steps


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> Path:
    """The user's folder, outside the repository, holding their scripts."""
    return user_folder(tmp_path_factory.mktemp("user project"))


# Every launch of this module, {run id: launcher arguments}: each script profiled once, unedited.
LAUNCHES: dict[str, tuple[str, ...]] = {
    **{
        f"cnn-{mode}": tuple(
            f"--script cnn_trainer.py --mode {mode} -- --steps 8 --batch 8".split()
        )
        for mode in ("single", "ddp")
    },
    "tf": ("--script", "tiny_transformer.py", "--no-profile", "--", "5"),
    "acc": ("--script", "accumulate.py", "--mode", "ddp", "--no-profile"),
    "crash": ("--script", "crash_rank.py", "--mode", "ddp", "--no-profile"),
    "nostep": ("--script", "no_step.py", "--no-profile"),
    "nogroup": ("--script", "no_group.py", "--mode", "ddp"),
    "ownprof": ("--script", "own_profiler.py"),
}


@pytest.fixture(scope="module")
def launched(user) -> dict[str, subprocess.CompletedProcess]:
    """Every launch of LAUNCHES started at once in the user's folder, each with its own run id
    (start-up mostly waits on one core: two cores finish them sooner together), {run id: the
    finished launcher}."""
    with ThreadPoolExecutor(max_workers=len(LAUNCHES)) as pool:
        futures = {
            run_id: pool.submit(_profile, user, *args[:2], "--run-id", run_id, *args[2:])
            for run_id, args in LAUNCHES.items()
        }
    return {run_id: future.result() for run_id, future in futures.items()}


@pytest.fixture(scope="module")
def cnn_runs(user, launched) -> Path:
    """The CNN trainer profiled as single and as 2-rank DDP, with the same arguments."""
    for mode in ("single", "ddp"):
        _ok(launched[f"cnn-{mode}"])
    return user / "runs"


@pytest.mark.parametrize("mode", ["single", "ddp"])
def test_the_cnn_trainer_gets_steps_phases_samples_and_traces(cnn_runs, mode):
    run_dir = cnn_runs / f"cnn-{mode}"
    rec = read_run(run_dir)
    world = 2 if mode == "ddp" else 1
    cfg = rec["config"]
    assert rec["status"] == "ok", rec["error"]
    assert (cfg["mode"], cfg["world_size"]) == (mode, world)
    assert cfg["backend"] == ("gloo" if mode == "ddp" else "none")
    assert cfg["model"] == "Sequential" and cfg["param_count"] == 4 * 9 + 4 + 144 * 4 + 4
    assert cfg["script"] == str(run_dir.parents[1] / "cnn_trainer.py")
    assert cfg["script_args"] == ["--steps", "8", "--batch", "8"]
    assert len(cfg["script_sha256"]) == 64
    rows = _steps(run_dir)
    assert sorted((int(r["step"]), int(r["rank"])) for r in rows) == [
        (s, r) for s in range(8) for r in range(world)
    ]
    for r in rows:  # 8 samples per rank and step; the phases lie inside the step
        assert int(r["samples"]) == 8
        phases = [float(r[f"{p}_s"]) for p in ("data", "forward", "backward", "optimizer")]
        assert float(r["forward_s"]) > 0 and float(r["backward_s"]) > 0
        assert float(r["optimizer_s"]) > 0
        assert sum(phases) <= float(r["step_time_s"]) * 1.001
    assert cfg["global_batch"] == 8 * world and cfg["per_device_batch"] == 8
    assert [int(r["profiled"]) for r in rows if r["rank"] == "0"] == [0, 1, 1, 1, 1, 0, 0, 0]
    traces = sorted(rec["traces"])
    assert [t.split(".")[0] for t in traces] == [f"traces/rank{r}" for r in range(world)]
    assert rec["metrics"]["memory_breakdown"][0]["counted_at_step"] == 1
    assert rec["eval"] == {"epochs": [], "best": None}
    load = rec["env"]["host_load"]  # rank 0 measured the host over the measured steps
    assert load["cores"] >= 1 and load["other_cpu_cores_mean"] >= 0 and load["own_threads"] >= 1
    assert (run_dir.parents[1] / "cnn_done.txt").read_text() == "done\n"  # the script's own file
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "step 7 loss" in log


def test_single_and_ddp_runs_of_one_script_pair_up_with_collectives_in_the_traces(cnn_runs):
    result = compare_runs([cnn_runs / "cnn-single", cnn_runs / "cnn-ddp"], progress=False)
    runs = {r["run_id"]: r for r in result["runs"]}
    ddp, single = runs["cnn-ddp"], runs["cnn-single"]
    assert ddp["baseline_run_id"] == "cnn-single"
    assert ddp["speedup"] == pytest.approx(ddp["samples_per_s"] / single["samples_per_s"])
    assert ddp["workload"] == single["workload"]
    assert ddp["workload"].startswith("script:") and ddp["workload"].endswith("--steps 8 --batch 8")
    assert ddp["comm_pct"] > 0  # the gloo all-reduces of DDP, the barrier and the logging loss
    names = {c["name"] for c in ddp["trace"]["collectives"]}
    assert any("allreduce" in n.replace("_", "").lower() for n in names), names
    assert {r["rank"] for r in ddp["trace"]["ranks"]} == {0, 1}
    # the default active window (3 steps), its last left out as analysis §3 says
    assert all(r["step_numbers"] == [2, 3] for r in ddp["trace"]["ranks"])
    assert ddp["top1_pct"] is None and ddp["test_loss"] is None  # accuracy unknown: absent


def test_script_runs_get_advice_they_can_act_on_and_captions_naming_the_script(cnn_runs):
    """The verdict tells a script that builds its own DDP the line of code to change, with the
    bucket count of its run, never a make target; captions name the script and its arguments."""
    data = compare_runs([cnn_runs / "cnn-single", cnn_runs / "cnn-ddp"], progress=False)
    (para,) = verdict(data)
    text = "".join(s["text"] for s in para["segments"])
    assert "DDP(model, bucket_cap_mb=...)" in text and "1 gradient bucket(s) per step" in text
    assert "DDP(model, gradient_as_bucket_view=True)" in text  # DDP's bucket copy, in memory
    assert "make " not in text and "--gradient" not in text
    assert para["workload"].startswith("cnn_trainer.py --steps 8 --batch 8 (cpu, ")
    assert set(scaling_frame(data)["panel"]) == {"cnn_trainer.py --steps 8 --batch 8"}
    assert "None" not in " ".join(group_labels(data).values())


def test_a_transformer_with_dict_batches_adamw_and_clipping(user, launched):
    _ok(launched["tf"])
    rec = read_run(user / "runs" / "tf")
    rows = _steps(user / "runs" / "tf")
    assert rec["status"] == "ok" and rec["config"]["model"] == "TinyLM"
    assert [int(r["step"]) for r in rows] == list(range(5))
    assert {int(r["samples"]) for r in rows} == {4}  # from the keyword input_ids
    # zero_grad at the loop's end is the next step's data; clipping is backward
    assert all(float(r["data_s"]) > 0 for r in rows[1:])
    assert rec["traces"] == []  # --no-profile


def test_gradient_accumulation_counts_one_step_per_optimizer_step(user, launched):
    _ok(launched["acc"])
    rec = read_run(user / "runs" / "acc")
    rows = _steps(user / "runs" / "acc")
    assert rec["config"]["mode"] == "ddp" and rec["config"]["grad_accum_steps"] == 2
    assert len(rows) == 6 * 2 and {int(r["samples"]) for r in rows} == {2 * 4}
    assert rec["config"]["global_batch"] == 16


def test_a_crashing_rank_fails_the_run_with_its_rank_code_and_log(user, launched):
    assert launched["crash"].returncode == 1
    rec = read_run(user / "runs" / "crash")
    err = rec["error"]
    assert rec["status"] == "failed"
    assert (err["rank"], err["exit_code"], err["kind"]) == (1, 1, "crash")
    assert "out of patience at step 3" in err["message"]
    assert any("out of patience" in line for line in err["log_tail"])
    steps = {int(r["step"]) for r in _steps(user / "runs" / "crash") if r["rank"] == "1"}
    assert steps == {0, 1, 2}  # what rank 1 recorded before it raised is kept


def test_a_script_that_never_steps_is_ok_with_a_warning(user, launched):
    _ok(launched["nostep"])
    rec = read_run(user / "runs" / "nostep")
    assert rec["status"] == "ok" and _steps(user / "runs" / "nostep") == []
    assert any("no optimizer step was seen" in w for w in rec["warnings"])


def test_a_script_that_ignores_world_size_is_recorded_as_what_it_was(user, launched):
    _ok(proc := launched["nogroup"])
    run_dir = user / "runs" / "nogroup"
    rec = read_run(run_dir)
    assert (rec["config"]["mode"], rec["config"]["world_size"]) == ("single", 1)
    assert {r["rank"] for r in _steps(run_dir)} == {"0"}
    assert any("none joined a process group" in w for w in rec["warnings"])
    assert "none joined a process group" in proc.stdout
    # Rank 1's trace stays on disk, left out of the run with the reason, never called foreign.
    assert [t.split(".")[0] for t in rec["traces"]] == ["traces/rank0"]
    (left,) = rec["traces_left_out"]
    assert left["file"].startswith("traces/rank1.") and (run_dir / left["file"]).is_file()
    assert "never joined a process group" in left["reason"]
    (entry,) = compare_runs([run_dir], progress=False)["runs"]
    assert [r["rank"] for r in entry["trace"]["ranks"]] == [0]  # rank 1's is not analysed
    said = " ".join(entry["warnings"])
    assert "left out of this run by its record (rank 1 never joined" in said
    assert "another run" not in said


def test_a_script_with_its_own_profiler_keeps_it(user, launched):
    _ok(launched["ownprof"])
    rec = read_run(user / "runs" / "ownprof")
    assert any("its own torch.profiler" in w for w in rec["warnings"])
    assert len(_steps(user / "runs" / "ownprof")) == 5
    assert json.loads((user / "my_trace.json").read_text())["traceEvents"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--script", "missing.py"], "--script missing.py: no such file"),
        (["--script", "cnn_trainer.py", "--model", "mlp"], "--model picks dpscope's built-in"),
        (["--script", "cnn_trainer.py", "--dataset=cifar10"], "--dataset picks dpscope's"),
        (["--script", "cnn_trainer.py", "--mode", "dp"], "--mode single, ddp or fsdp, not dp"),
        # Options of dpscope's built-in training do nothing to a script: refused, one line each.
        (["--script", "cnn_trainer.py", "--epochs", "3"], "--epochs does nothing with --script"),
        (["--script", "cnn_trainer.py", "--batch-size=32"], "--batch-size does nothing with"),
        (["--script", "cnn_trainer.py", "--threads", "1"], "--threads does nothing with"),
        (["--script", "cnn_trainer.py", "--epoch", "3"], "--epoch does nothing with --script"),
        (["--script", "cnn_trainer.py", "--no-checkpoint"], "--no-checkpoint does nothing"),
        (["--script", "cnn_trainer.py", "--backend", "gloo"], "the script passes its backend"),
        (["--script", "cnn_trainer.py", "--max-steps", "2"], "--warmup-steps (2) leaves no"),
    ],
)
def test_bad_script_arguments_get_one_line_and_nothing_written(
    user, capsys, argv, says, monkeypatch
):
    monkeypatch.chdir(user)
    assert launcher.main([*argv, "--runs-dir", "bad-runs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (user / "bad-runs").exists()


def test_run_recorder_in_process_writes_the_standard_run_folder(tmp_path):
    import torch
    from torch import nn

    from profiler import RunRecorder
    from profiler.session import ProfileConfig

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    profile = ProfileConfig(wait=1, warmup=1, active=2)
    with RunRecorder(runs_dir=tmp_path, run_id="rr", model=model, profile=profile) as rec:
        for _ in range(7):
            with rec.step():  # samples from the model's first input
                with rec.phase("data"):
                    x, y = torch.randn(6, 8), torch.randint(0, 2, (6,))
                with rec.phase("forward"):
                    loss = nn.functional.cross_entropy(model(x), y)
                with rec.phase("backward"):
                    loss.backward()
                with rec.phase("optimizer"):
                    optimizer.step()
                    optimizer.zero_grad()
    run = read_run(tmp_path / "rr")
    rows = _steps(tmp_path / "rr")
    assert run["status"] == "ok" and run["config"]["mode"] == "single"
    assert [int(r["step"]) for r in rows] == list(range(7))
    assert {int(r["samples"]) for r in rows} == {6}
    assert [int(r["profiled"]) for r in rows] == [0, 1, 1, 1, 0, 0, 0]
    assert len(run["traces"]) == 1 and (tmp_path / "rr" / run["traces"][0]).is_file()
    breakdown = run["metrics"]["memory_breakdown"][0]
    assert breakdown["optimizer_state_bytes"] == breakdown["parameters_bytes"]  # SGD momentum
    assert run["metrics"]["samples_per_s"] > 0
    assert run["env"]["host_load"]["cores"] >= 1  # env.host_load from an in-process recorder too


def test_run_recorder_phase_outside_a_step_names_the_fix(tmp_path):
    from profiler import RunRecorder

    with RunRecorder(runs_dir=tmp_path, run_id="bad") as rec:  # closed: one open per process
        with pytest.raises(ValueError, match="inside `with rec.step"):
            with rec.phase("forward"):
                pass
