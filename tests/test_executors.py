"""The process pool's start method (analysis.trace.executors): workers are forked only from a
caller with no thread but its main one and none of the thread-keeping libraries (torch, Dask)
loaded, and forked workers give the same result as workers from a fresh server process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.analysis import build_trace_set
from tests.conftest import DATA, REPO

SOURCE = DATA / "hta" / "trace_filter" / "sampled_rank-0.json.gz"

# What a caller looks like at each stage, the way users reach the pool: the CLI (its own bars),
# a notebook or script with a tqdm bar of its own (tqdm's monitor thread), a script that started
# a thread of its own.
PROBE = """
import threading, time
from tqdm import tqdm
from analysis.progress import Bar
from analysis.trace.executors import fork_is_safe
seen = {"bare": fork_is_safe()}
with Bar(total=1, disable=True):
    seen["analysis_bar"] = fork_is_safe()
with tqdm(total=1, disable=True):
    seen["tqdm_monitor"] = fork_is_safe()
seen["after_bars"] = fork_is_safe()
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
seen["own_thread"] = fork_is_safe()
print(seen)
"""

# A fresh caller as `dpscope traces` is: the default start method, then forkserver's result.
ANALYSE = """
import json, sys
from analysis.trace.executors import Executor, _context
from analysis.trace.folder import analyze_trace_dir
out = {"method": _context(None).get_start_method()}
for method in (None, "forkserver"):
    ex = Executor(workers=2, start_method=method, cache=False)
    r = analyze_trace_dir(sys.argv[1], workers=2, progress=True, executor=ex)
    out[method or "default"] = json.dumps(r, sort_keys=True, default=str)
    out.setdefault("method_after", _context(None).get_start_method())  # its bar started no thread
print(json.dumps(out))
"""

# A pool forked while the caller has garbage collection paused, as folder.reduce_files has it.
FORKED_GC = """
import gc
from concurrent.futures import ProcessPoolExecutor
from analysis.trace.executors import _context, _worker_init
gc.disable()
with ProcessPoolExecutor(1, mp_context=_context(None), initializer=_worker_init) as pool:
    print(pool.submit(gc.isenabled).result(), gc.isenabled())
"""


def _python(code: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.integration
def test_workers_fork_only_from_a_lone_thread_without_torch_or_dask():
    linux = sys.platform == "linux"
    # tqdm's monitor thread outlives its bars: that process never forks its workers again.
    expect = {"bare": linux, "analysis_bar": linux, "tqdm_monitor": False,
              "after_bars": False, "own_thread": False}  # fmt: skip
    assert _python(PROBE) == str(expect)
    for module in ("torch", "distributed"):
        code = f"import {module}\nfrom analysis.trace.executors import fork_is_safe\n"
        assert _python(code + "print(fork_is_safe())") == "False", module


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux", reason="fork is only chosen on Linux")
def test_forked_workers_give_the_forkserver_result(tmp_path: Path):
    build_trace_set(tmp_path, 3, SOURCE)
    out = json.loads(_python(ANALYSE, str(tmp_path)))
    assert out["method"] == out["method_after"] == "fork"
    assert json.loads(out["default"])["ranks"] and out["default"] == out["forkserver"]


@pytest.mark.integration
def test_a_worker_collects_garbage_though_its_caller_paused_it():
    assert _python(FORKED_GC) == "True False"
