"""Shared pieces of the `make bench-*` scripts: interleaved repeats, medians, the JSON output and
a subprocess runner that samples the RSS of its whole process tree with psutil.

Arms run interleaved (A B C, B C A, C A B, ...), so drift on a busy machine (another job starting,
thermal throttling) lands on every arm alike instead of on whichever ran last.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import psutil

from workloads.launch.child import PACKAGE_ROOT, child_env, user_path

__all__ = ["TEST_DATA", "bench_out", "interleaved", "median", "recorded", "run_tree", "write_json"]

TEST_DATA = PACKAGE_ROOT / "tests" / "data"
"""The reference traces in tests/data (HTA test traces the analysis benches copy)."""


def interleaved(arms: dict[str, Callable[[], dict]], repeats: int) -> dict[str, list[dict]]:
    """Run every arm `repeats` times, rotating the arm order each round; results per arm."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = list(arms)
    out: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            print(f"  round {r + 1}/{repeats}: {name} ...", flush=True)
            out[name].append(arms[name]())
    return out


def median(results: list[dict], key: str) -> float | None:
    """Median of `key` over the repeats that have a number for it."""
    values = [r[key] for r in results if isinstance(r.get(key), int | float)]
    return statistics.median(values) if values else None


def bench_out(name: str, given: str | None) -> Path:
    """Where a bench writes its JSON: BENCH_OUT when it names a .json file, `<BENCH_OUT>/<name>.json`
    when it names a folder, else `reports/bench/<name>.json`; relative to the folder the bench
    was run in (for `make bench-*`: the repository)."""
    path = user_path(given or Path("reports", "bench"))
    return path if path.suffix == ".json" else path / f"{name}.json"


def recorded() -> dict:
    """When, at which commit and on what machine a bench ran (docs/benchmarks.md shows it)."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(PACKAGE_ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except OSError:  # no git on this machine
        commit = ""
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit or None,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": psutil.cpu_count(),
            "os": platform.system(),
            "python": platform.python_version(),
            # Other jobs on the host slow every arm: the load says how busy it was.
            "load_avg_1m": round(os.getloadavg()[0], 1) if hasattr(os, "getloadavg") else None,
        },
    }


def write_json(path: Path, obj: dict) -> None:
    """Write `obj` to `path` atomically (temp file in the same folder, then rename), stamped with
    `recorded` (date, commit, machine) unless it already carries one."""
    obj = {**obj, "recorded": obj.get("recorded") or recorded()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def run_tree(args: list[str], *, env: dict | None = None, timeout: float = 1800) -> dict:
    """Run `python ARGS` in this folder (stdout comes back under `stdout`); sample RSS of it and all
    its children every 20 ms. The process tree is listed every 100 ms only: listing it reads
    every process's /proc entry (~1 ms), which every 20 ms took ~8% of a 2-core job's time.

    Returns `wall_s`, `stdout`, `rss_sum_of_peaks_mb` (each process's own peak RSS, summed over
    every process seen in the tree: what the job needs if all peaks coincide),
    `rss_peak_of_sum_mb` (the largest sampled sum over the processes alive at one moment),
    `rss_root_peak_mb` (the process started) and `rss_worker_peak_mb` (the largest peak of any
    process below it: a worker's; 0 when it started none).
    """
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *args],
        env=child_env(**(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    root = psutil.Process(proc.pid)
    peaks: dict[int, int] = {}
    peak_sum = 0
    tree: list[psutil.Process] = []
    for tick in itertools.count():
        if proc.poll() is not None:
            break
        now = 0
        if tick % 5 == 0:
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                tree = []
        for p in tree:
            try:  # RSS only: reading PSS (smaps) every 20 ms would slow the job down
                rss = p.memory_info().rss
            except psutil.Error:  # exited between listing and reading
                continue
            peaks[p.pid] = max(peaks.get(p.pid, 0), rss)
            now += rss
        peak_sum = max(peak_sum, now)
        if time.perf_counter() - start > timeout:
            proc.kill()
            raise SystemExit(f"error: bench job ran over {timeout:.0f} s: {' '.join(args)}")
        time.sleep(0.02)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"error: bench job failed ({proc.returncode}): {' '.join(args)}\n{err[-2000:]}"
        )
    children = [v for pid, v in peaks.items() if pid != proc.pid]
    return {
        "wall_s": wall,
        "stdout": out,
        "rss_sum_of_peaks_mb": sum(peaks.values()) / 1e6,
        "rss_peak_of_sum_mb": peak_sum / 1e6,
        "rss_root_peak_mb": peaks.get(proc.pid, 0) / 1e6,
        "rss_worker_peak_mb": max(children, default=0) / 1e6,
    }
