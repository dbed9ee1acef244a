"""The benches' job runner (bench.common.run_tree) sees a worker's memory: the process tree is
listed every 100 ms, and each listed process's RSS read every 20 ms."""

from __future__ import annotations

import pytest

from bench.common import run_tree

# The job starts one child that touches 200 MB and holds it for 2 s (20 listings), then exits.
JOB = """
import subprocess, sys
subprocess.run([sys.executable, "-c",
                "import time; b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096]); "
                "time.sleep(2.0)"], check=True)
print("done")
"""


@pytest.mark.integration
def test_a_workers_peak_is_seen_and_told_apart_from_the_root():
    res = run_tree(["-c", JOB])
    assert res["stdout"].strip() == "done"
    assert res["rss_worker_peak_mb"] >= 200, res
    assert res["rss_root_peak_mb"] < 100, res  # the root's own memory, not its child's
    assert res["rss_sum_of_peaks_mb"] >= res["rss_root_peak_mb"] + 200, res
    assert res["rss_peak_of_sum_mb"] >= res["rss_worker_peak_mb"], res
