"""Hostile input v4 (issue 36), the option class: every option checked before anything is written,
with the flag named in one line (exit code 2) and no runs folder created; numbers finite and in
range; the machine's cores bound --threads and --num-workers; the batch fits the dataset; numbers
in --model-args written with ASCII digits; user code that calls sys.exit named as such.

In-process (the launcher's main), so a case that slipped past the checks would show as a
started child (refused by the fast tier's process guard) or a folder that exists."""

from __future__ import annotations

import os

import pytest

from profiler.runfolder.layout import MAX_RUN_ID_BYTES
from workloads.comm import bench
from workloads.launch import launcher
from workloads.tools import tune

FAST = "--model mlp --dataset synthetic --max-steps 4 --batch-size 32 --no-profile --device cpu"


def _one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

LAUNCH_CASES = {  # name -> (arguments, words of the one line)
    "lr-nan": ("--lr nan", "--lr must be a finite number"),
    "lr-inf": ("--lr inf", "--lr must be a finite number"),
    "momentum-nan": ("--momentum nan", "--momentum must be a finite number"),
    "weight-decay-inf": ("--weight-decay inf", "--weight-decay must be a finite number"),
    "bucket-nan": ("--bucket-cap-mb nan", "--bucket-cap-mb must be a finite number"),
    "bucket-zero": ("--bucket-cap-mb 0", "--bucket-cap-mb must be a finite number in (0,"),
    "timeout-nan": ("--collective-timeout nan", "--collective-timeout must be a finite number"),
    "timeout-inf": ("--collective-timeout inf", "--collective-timeout must be a finite number"),
    "timeout-year": ("--collective-timeout 31536000", "--collective-timeout must be a finite"),
    "threads": ("--threads 100000", f"--threads 100000 is above the {CORES} CPU core(s)"),
    "workers": ("--num-workers 500", f"--num-workers 500 is above the {CORES} CPU core(s)"),
    "batch-vs-data": (
        "--batch-size 1000000000",
        "more than the 2048 samples of --dataset synthetic's training split; lower --batch-size",
    ),
    "weak-batch-vs-data": (
        "--mode ddp --backend gloo --nproc 2 --scaling weak --batch-size 1500",
        "(--scaling weak: 1500 × 2), more than the 2048 samples",
    ),
    "arabic-digits": ("--model-args hidden=١٢", "--model-args hidden='١٢' is not a finite number"),
    "underscore": ("--model-args hidden=1_000", "written with the ASCII digits 0-9"),
    "nan-arg": ("--dataset-args n=nan", "--dataset-args n='nan' is not a finite number"),
    "eval-batches": ("--eval-batches -1", "--eval-batches must be >= 0; got -1"),
    "rdzv-single": ("--rdzv-file r", "--rdzv-file sets DDP's rendezvous; --mode single has none"),
    "rdzv-both": (
        "--mode ddp --backend gloo --rdzv-file r --file-rendezvous",
        "--rdzv-file and --file-rendezvous both",
    ),
    "run-id-long": (f"--run-id {'x' * (MAX_RUN_ID_BYTES + 1)}", "over the 128-byte limit"),
}


@pytest.mark.parametrize("case", list(LAUNCH_CASES))
def test_each_bad_option_is_one_line_and_nothing_is_written(case, tmp_path, capsys):
    args, words = LAUNCH_CASES[case]
    runs = tmp_path / "runs"
    assert launcher.main([*FAST.split(), *args.split(), "--runs-dir", str(runs)]) == 2
    assert words in _one_line(capsys.readouterr().err)
    assert not runs.exists()


def test_mode_all_checks_every_mode_before_the_first_runs(tmp_path, capsys):
    """`--mode all`'s runs are all planned and checked first: a batch too large for the data is
    one line, not a single run that started and then a failure."""
    runs = tmp_path / "runs"
    assert (
        launcher.main(
            [*FAST.split(), "--mode", "all", "--batch-size", "4096", "--runs-dir", str(runs)]
        )
        == 2
    )
    assert "--batch-size 4096: the global batch of --mode single is 4096" in _one_line(
        capsys.readouterr().err
    )
    assert not runs.exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ("--max-bytes -1", "--max-bytes must be a byte count from 4"),
        ("--max-bytes 2", "--max-bytes must be a byte count from 4"),
        (f"--max-bytes {1 << 40}", "(64 GiB) or 0 for the default; got 1099511627776"),
        (f"--sizes {1 << 40}", "--sizes must be a byte count from 4"),
        ("--threads 100000", "--threads 100000 is above the"),
        ("--run-id ..", "--run-id '..' names the runs folder or its parent"),
        ("--run-id a/b", "--run-id is a folder name, not a path"),
    ],
)
def test_bench_comm_options_are_one_line_before_any_rank(args, words, tmp_path, capsys):
    """`bench-comm --max-bytes -1` used to fail with a traceback on every rank."""
    runs = tmp_path / "runs"
    argv = ["--backend", "gloo", "--nproc", "2", *args.split(), "--runs-dir", str(runs)]
    assert bench.main(argv, prog="dpscope bench-comm") == 2
    assert words in _one_line(capsys.readouterr().err)
    assert not runs.exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ("--alpha 7", "--alpha must be a significance level strictly between 0 and 1"),
        ("--alpha 1", "strictly between 0 and 1"),
        ("--alpha 0", "strictly between 0 and 1"),
        ("--alpha nan", "strictly between 0 and 1"),
        ("--budget-s nan", "TUNE_BUDGET_S (--budget-s) must be a finite number >= 0"),
        ("--loss-tolerance inf", "--loss-tolerance must be a finite number >= 0"),
        ("--tune-id ..", "--tune-id '..' names the runs folder or its parent"),
        ("--tune-id .", "--tune-id '.' names the runs folder"),
    ],
)
def test_tune_options_are_one_line(args, words, tmp_path, capsys):
    runs = tmp_path / "runs"
    argv = ["--model", "mlp", "--dataset", "synthetic", "--batch-size", "32", "--nproc", "2"]
    argv += ["--backend", "gloo", "--max-steps", "4", *args.split(), "--runs-dir", str(runs)]
    assert tune.main(argv, prog="dpscope tune") == 2
    assert words in _one_line(capsys.readouterr().err)
    assert not runs.exists()
