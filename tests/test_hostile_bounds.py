"""Hostile input v4 (issue 36), the bounds class: cost follows the work done, not what a dataset
or a log claims. A dataset of 10¹² samples trains and evaluates in the memory of a small one (the
sampler draws its order without a permutation of the whole split, identical on every rank, and
evaluation stops at --eval-batches); a log line of 70 MB costs run.json a few hundred bytes.
(The trace inflate bound is in tests/test_hostile_trace_files.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from profiler.runfolder.layout import RUN_JSON, write_run_json
from profiler.runfolder.records import read_record
from tests.conftest import read_run
from workloads.config import EVAL_BATCH, TrainConfig
from workloads.launch.child import child_env
from workloads.launch.runlog import LOG_LINE_CHARS, LOG_TAIL_LINES, MESSAGE_CHARS, finalize
from workloads.launch.supervise import Outcome
from workloads.plan import Environment, plan
from workloads.record import run_record
from workloads.train.data import GlobalBatchSampler, eval_loader
from workloads.train.permutation import permute

HUGE = 10**12


def test_the_sampler_needs_no_permutation_of_the_whole_split():
    """A dataset claiming 3e8 samples peaked at 3.2 GB for 6 steps (a full randperm per epoch),
    10¹² tried to allocate 8 TB. Each rank now evaluates the epoch's permutation at the
    positions it reads: the same global batches on every rank, split between them."""
    single = GlobalBatchSampler(num_samples=HUGE, global_batch=64, rank=0, replicas=1, seed=5)
    ranks = [
        GlobalBatchSampler(num_samples=HUGE, global_batch=64, rank=r, replicas=2, seed=5)
        for r in range(2)
    ]
    steps = [iter(s) for s in (single, *ranks)]
    seen: set[int] = set()
    for _ in range(3):
        full, r0, r1 = (next(it) for it in steps)
        assert r0 + r1 == full and len(full) == 64
        assert all(0 <= i < HUGE for i in full) and not seen & set(full)
        seen |= set(full)
    assert len(single) == HUGE // 64


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000, 4099])
def test_the_order_is_a_permutation(n):
    order = permute(torch.arange(n), n, "3:1").tolist()
    assert sorted(order) == list(range(n))
    assert order == permute(torch.arange(n), n, "3:1").tolist()  # the same in every process
    assert n < 8 or order != permute(torch.arange(n), n, "3:2").tolist()  # each epoch its own


def test_evaluation_stops_at_eval_batches_and_covers_the_same_samples_on_any_world():
    test = torch.utils.data.TensorDataset(torch.arange(1000.0), torch.arange(1000))
    one = eval_loader(test, rank=0, world_size=1, batch_size=256, num_workers=0, pin_memory=False,
                      max_samples=2 * 256)  # fmt: skip
    two = [
        eval_loader(
            test,
            rank=r,
            world_size=2,
            batch_size=256,
            num_workers=0,
            pin_memory=False,
            max_samples=2 * 256,
        )  # fmt: skip
        for r in range(2)
    ]
    covered = sorted(int(x) for loader in two for xs, _ in loader for x in xs)
    assert covered == sorted(int(x) for xs, _ in one for x in xs) == list(range(512))
    assert TrainConfig().eval_batches * EVAL_BATCH >= 10_000  # CIFAR's test split, whole


@pytest.mark.integration
def test_a_run_records_its_evaluation_cap(single_mlp_run):
    run = read_run(single_mlp_run)
    assert run["config"]["eval_batches"] == 50
    assert run["eval"]["split_samples"] == 512  # synthetic's test split
    assert [e["samples"] for e in run["eval"]["epochs"]] == [512]


_CLAIMS = textwrap.dedent(
    """
    import torch
    from torch.utils.data import Dataset


    class Claims(Dataset):
        '''n samples, each made from its index: nothing is stored.'''

        num_classes = 10

        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i % 100_003)
            return torch.randn(3, 32, 32, generator=g), int(i % 10)


    def data(n: int = 1000):
        return Claims(n), Claims(n)
    """
)

_TRAIN_AND_MEASURE = """
import json, sys
from workloads.train.loop import main
code = main(sys.argv[1:])
hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"code": code, "hwm_mb": int(hwm.split()[1]) // 1024}))
"""


def _peak_mb(tmp_path, n: int) -> int:
    argv = ["--model", "mlp", "--dataset", "claims:data", "--dataset-args", f"n={n}"]
    argv += ["--max-steps", "3", "--warmup-steps", "1", "--batch-size", "32", "--no-profile"]
    argv += ["--eval-batches", "1", "--device", "cpu", "--threads", "1"]
    argv += ["--runs-dir", str(tmp_path / "runs"), "--run-id", f"n{n}"]
    proc = subprocess.run(
        [sys.executable, "-c", _TRAIN_AND_MEASURE, *argv],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["code"] == 0
    return out["hwm_mb"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.integration
def test_a_dataset_claiming_1e12_samples_trains_in_bounded_memory(tmp_path):
    """Measured in fresh processes (VmHWM of each): the 10¹²-sample run's peak is the
    1000-sample run's, within 100 MB (a permutation of 10¹² would be 8 TB; an eval over the
    claimed test split would never end)."""
    (tmp_path / "claims.py").write_text(_CLAIMS)
    small, huge = _peak_mb(tmp_path, 1000), _peak_mb(tmp_path, HUGE)
    print(f"VmHWM: {small} MB (1000 samples), {huge} MB (10^12 samples)")
    assert huge < small + 100, (small, huge)
    run = json.loads((tmp_path / "runs" / f"n{HUGE}" / RUN_JSON).read_text())
    assert (
        run["eval"]["split_samples"] == HUGE and run["eval"]["epochs"][0]["samples"] == EVAL_BATCH
    )


def test_log_tails_and_messages_are_capped(tmp_path):
    """A failing rank that printed a 70 MB line made run.json exceed dpscope's own 64 MiB read
    limit, so `runs` listed the run as invalid. The tail is read from the log's end only, each
    line cut, and the error message too."""
    cfg = TrainConfig(run_id="loud", runs_dir=str(tmp_path), device="cpu")
    run_dir = tmp_path / "loud"
    (run_dir / "logs").mkdir(parents=True)
    write_run_json(run_dir, run_record(cfg, plan(cfg, Environment.detect()), status="running",
                                       threads_per_rank=1))  # fmt: skip
    line = "x" * 70_000_000
    (run_dir / "logs" / "rank0.log").write_text(f"start\n{line}\nend\n")
    (run_dir / "logs" / "rank0.error.json").write_text(
        json.dumps({"rank": 0, "exit_code": 1, "message": f"ValueError: {line}", "time": 1.0})
    )
    launcher_log = run_dir / "logs" / "launcher.log"
    launcher_log.write_text(line + "\n")
    record = finalize(run_dir, Outcome(1), launcher_log)
    assert (run_dir / RUN_JSON).stat().st_size < 20_000
    rec, _ = read_record(run_dir / RUN_JSON)  # readable by dpscope's own reader
    assert rec.status == "failed"
    tail = record["error"]["log_tail"]
    assert len(tail) <= LOG_TAIL_LINES and tail[-1] == "end"
    assert all(len(t) <= LOG_LINE_CHARS + 40 for t in tail)
    assert "more chars]" in tail[0] and tail[0].startswith("… x")
    assert len(record["error"]["message"]) < MESSAGE_CHARS + 100
