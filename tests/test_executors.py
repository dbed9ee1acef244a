"""The process pool's start method (analysis.trace.executors): workers are forked only from a
caller that is one thread (tqdm's monitor aside) with neither torch nor Dask loaded, and forked
workers give the same result as workers from a fresh server process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.trace.executors import Executor
from analysis.trace.folder import analyze_trace_dir
from bench.analysis import build_trace_set
from tests.conftest import DATA, REPO

SOURCE = DATA / "hta" / "trace_filter" / "sampled_rank-0.json.gz"

# What a caller looks like at each stage, the way users reach the pool: the CLI (a progress bar),
# a script that started a thread of its own, a training script that imported torch.
PROBE = """
import sys, threading, time
from analysis.trace.executors import fork_is_safe
from tqdm import tqdm
seen = {"bare": fork_is_safe()}
with tqdm(total=1, disable=True):
    seen["tqdm_monitor"] = fork_is_safe()
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
seen["own_thread"] = fork_is_safe()
print(seen)
"""


@pytest.mark.integration
def test_workers_fork_only_from_a_lone_thread_without_torch_or_dask():
    def probe(code: str) -> str:
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    expect = {"bare": True, "tqdm_monitor": True, "own_thread": False}
    assert probe(PROBE) == str(expect if sys.platform == "linux" else dict.fromkeys(expect, False))
    for module in ("torch", "distributed"):
        code = f"import {module}\nfrom analysis.trace.executors import fork_is_safe\n"
        assert probe(code + "print(fork_is_safe())") == "False", module


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux", reason="fork is only chosen on Linux")
def test_forked_workers_give_the_forkserver_result(tmp_path: Path):
    build_trace_set(tmp_path, 3, SOURCE)

    def result(method: str) -> str:
        ex = Executor(workers=2, start_method=method, cache=False)
        out = analyze_trace_dir(tmp_path, workers=2, progress=False, executor=ex)
        return json.dumps(out, sort_keys=True, default=str)

    forked = result("fork")
    assert json.loads(forked)["ranks"] and forked == result("forkserver")
