"""`make bench-analysis`: dpscope vs HTA on the same 8-rank trace set, in one run.

The set is the real df_index_resolver trace (216k events, 54 MB of JSON) copied to 8 ranks with
`distributedInfo` rewritten, in a temp folder. Each tool runs in its own fresh subprocess (import
cost excluded from the timed part, reported separately) doing the same job: load every rank,
temporal breakdown, comm/comp overlap. Peak memory is sampled with psutil over the subprocess and
all its children (HTA and dpscope both fork workers): the sum over the tree and the largest
process. Prints both tools' numbers and the ratios; target: >= 5x faster, <= 1/2 the peak memory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.common import TEST_DATA
from workloads.launch.child import child_env

__all__ = ["main"]

SOURCE = TEST_DATA / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"

# Each job prints one JSON line {"seconds": ...}: wall time of the analysis itself.
DPSCOPE_JOB = """
import json, sys, time
from analysis.trace.folder import analyze_trace_dir
t = time.perf_counter()
r = analyze_trace_dir(sys.argv[1], progress=False)
print(json.dumps({"seconds": time.perf_counter() - t, "ranks": len(r["ranks"]),
                  "overlap_pct": [x["overlap_pct"] for x in r["ranks"]]}))
"""
HTA_JOB = """
import json, logging, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_temporal_breakdown(visualize=False)
o = a.get_comm_comp_overlap(visualize=False)
print(json.dumps({"seconds": time.perf_counter() - t, "ranks": len(o),
                  "overlap_pct": o["comp_comm_overlap_pctg"].tolist()}))
"""


def build_trace_set(out: Path, ranks: int, source: Path = SOURCE) -> None:
    """`ranks` copies of the `source` trace, each with its own rank in `distributedInfo`."""
    text = gzip.decompress(source.read_bytes())
    pattern = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*\}')
    if not pattern.search(text):
        raise SystemExit(f"error: {source}: no distributedInfo to rewrite — is this the HTA trace?")
    for r in range(ranks):
        info = json.dumps({"backend": "nccl", "rank": r, "world_size": ranks}).encode()
        data = pattern.sub(b'"distributedInfo": ' + info, text, count=1)
        (out / f"rank{r}.pt.trace.json.gz").write_bytes(gzip.compress(data, compresslevel=1))


def run_job(code: str, trace_dir: Path) -> dict:
    """Run `code` in a fresh interpreter; sample the RSS of it and its children every 20 ms."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(trace_dir)],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    root = psutil.Process(proc.pid)
    peak_sum = peak_one = 0
    while proc.poll() is None:
        try:  # RSS only: reading PSS (smaps) every 20 ms would slow both tools down
            rss = [p.memory_info().rss for p in (root, *root.children(recursive=True))]
        except psutil.Error:  # a worker exited between listing and reading
            rss = []
        peak_sum, peak_one = max(peak_sum, sum(rss)), max(peak_one, max(rss, default=0))
        time.sleep(0.02)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: benchmark job failed ({proc.returncode}):\n{err[-2000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    return {
        **result,
        "wall_s": wall,
        "peak_tree_mb": peak_sum / 1e6,
        "peak_proc_mb": peak_one / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.analysis", description=__doc__.splitlines()[0]
    )
    p.add_argument("--ranks", type=int, default=8, help="copies of the trace (default 8)")
    args = p.parse_args(argv)
    try:
        import hta  # noqa: F401  (installed by `make bench-analysis` from requirements-bench.txt)
    except ImportError:
        print(
            "error: holistictraceanalysis is not installed — run `make bench-analysis`",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="dpscope-bench-") as tmp:
        trace_dir = Path(tmp)
        print(f"building {args.ranks} ranks from {SOURCE.name} ...", flush=True)
        build_trace_set(trace_dir, args.ranks)
        print("dpscope ...", flush=True)
        ours = run_job(DPSCOPE_JOB, trace_dir)
        print("HTA ...", flush=True)
        theirs = run_job(HTA_JOB, trace_dir)
    print(
        f"\n{args.ranks} ranks x {SOURCE.name}, {psutil.cpu_count()} cores; memory = peak RSS"
        " over the job's process tree (sum) and of its largest process"
    )
    print(f"{'':10}{'analysis s':>11}{'process s':>11}{'RSS sum MB':>12}{'largest MB':>12}")
    for name, r in (("dpscope", ours), ("HTA 0.5.0", theirs)):
        print(
            f"{name:10}{r['seconds']:11.2f}{r['wall_s']:11.2f}{r['peak_tree_mb']:12.0f}"
            f"{r['peak_proc_mb']:12.0f}"
        )
    speed = theirs["seconds"] / ours["seconds"]
    print(f"\nspeed-up: {speed:.1f}x HTA (target >= 5x)")
    print(
        f"peak memory vs HTA (target <= 0.5): sum {ours['peak_tree_mb'] / theirs['peak_tree_mb']:.2f},"
        f" largest process {ours['peak_proc_mb'] / theirs['peak_proc_mb']:.2f}"
    )
    print(
        f"overlap % rank 0: dpscope {ours['overlap_pct'][0]:.2f}, HTA {theirs['overlap_pct'][0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
