"""`make bench-analysis`: dpscope vs HTA 0.5.0 on the same 8-rank trace set, side by side in one run.

The set is the real df_index_resolver trace (216k events, 54 MB of JSON) copied to 8 ranks with
`distributedInfo` rewritten, in a temp folder. Each arm runs in its own fresh subprocess (import
cost excluded from the timed part, reported separately) doing the same job: load every rank,
temporal breakdown, comm/comp overlap. The arms run interleaved, `--repeats` rounds (>= 3), and
the medians are compared: dpscope (no cache: every trace decoded), HTA, and dpscope again with
its trace cache warm (a second report of the same traces, on its own copy of the set). Peak
memory is sampled with psutil over each job's process tree (both tools fork workers): the sum of
each process's peak, and the largest process. Targets: >= 10x HTA's speed (uncached) at <= 1/2
its peak memory. Results: reports/bench/hta.json (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import psutil

from analysis.trace.cache import CACHE_ENV
from bench.common import TEST_DATA, bench_out, interleaved, median, run_tree, write_json

__all__ = ["main"]

SOURCE = TEST_DATA / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"

# Each job prints one JSON line {"seconds": ...}: wall time of the analysis itself. argv: the
# trace folder, then optionally the executor (process | dask) and the worker count.
# `cpu_s`: CPU seconds (user + system) of the job and its workers during the analysis (Linux/
# macOS; None elsewhere): less sensitive than wall time to other jobs on a busy host. Workers
# reaped by this process are in RUSAGE_CHILDREN; those reaped by a live child (dpscope's
# forkserver) are in that child's children times, so each live child counts with its own.
CPU = """
def cpu():
    try:
        import resource
    except ImportError:
        return None
    import psutil
    own = sum(x.ru_utime + x.ru_stime for x in (resource.getrusage(resource.RUSAGE_SELF),
                                                resource.getrusage(resource.RUSAGE_CHILDREN)))
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        own += t.user + t.system + getattr(t, "children_user", 0) + getattr(t, "children_system", 0)
    return own
"""
DPSCOPE_JOB = (
    CPU
    + """
import json, sys, time
from analysis.trace.executors import Executor
from analysis.trace.folder import analyze_trace_dir
kind = sys.argv[2] if len(sys.argv) > 2 else "process"
workers = int(sys.argv[3]) if len(sys.argv) > 3 else None
t, c = time.perf_counter(), cpu()
r = analyze_trace_dir(sys.argv[1], progress=False, workers=workers, executor=Executor(kind=kind))
print(json.dumps({"seconds": time.perf_counter() - t, "cpu_s": c and cpu() - c,
                  "ranks": len(r["ranks"]), "overlap_pct": [x["overlap_pct"] for x in r["ranks"]]}))
"""
)
HTA_JOB = (
    CPU
    + """
import json, logging, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t, c = time.perf_counter(), cpu()
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_temporal_breakdown(visualize=False)
o = a.get_comm_comp_overlap(visualize=False)
print(json.dumps({"seconds": time.perf_counter() - t, "cpu_s": c and cpu() - c, "ranks": len(o),
                  "overlap_pct": o["comp_comm_overlap_pctg"].tolist()}))
"""
)


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


def run_job(code: str, trace_dir: Path, env: dict | None = None) -> dict:
    """Run `code` on `trace_dir` in a fresh interpreter; its result line plus wall time and RSS."""
    res = run_tree(["-c", code, str(trace_dir)], env=env)
    return {**json.loads(res.pop("stdout").strip().splitlines()[-1]), **res}


def _summary(results: dict[str, list[dict]]) -> dict:
    """Medians per arm, and the ratios the targets are about."""
    arms = {
        name: {
            "analysis_s": median(rs, "seconds"),
            "analysis_cpu_s": median(rs, "cpu_s"),
            "process_s": median(rs, "wall_s"),
            "rss_sum_of_peaks_mb": median(rs, "rss_sum_of_peaks_mb"),
            "rss_largest_process_mb": median(
                [{"v": max(r["rss_root_peak_mb"], r["rss_worker_peak_mb"])} for r in rs], "v"
            ),
            "repeats_analysis_s": [r["seconds"] for r in rs],
        }
        for name, rs in results.items()
    }
    ours, hta, warm = arms["dpscope"], arms["hta"], arms["dpscope_cached"]
    return {
        "arms": arms,
        "speedup_vs_hta": hta["analysis_s"] / ours["analysis_s"],
        "speedup_cached_vs_hta": hta["analysis_s"] / warm["analysis_s"],
        "cpu_ratio_vs_hta": (
            hta["analysis_cpu_s"] / ours["analysis_cpu_s"] if ours["analysis_cpu_s"] else None
        ),
        "rss_sum_ratio_vs_hta": ours["rss_sum_of_peaks_mb"] / hta["rss_sum_of_peaks_mb"],
        "rss_largest_ratio_vs_hta": ours["rss_largest_process_mb"] / hta["rss_largest_process_mb"],
        "overlap_pct_rank0": {
            "dpscope": results["dpscope"][0]["overlap_pct"][0],
            "hta": results["hta"][0]["overlap_pct"][0],
        },
        "goals": {"speedup_vs_hta_min": 10, "rss_ratio_vs_hta_max": 0.5},
    }


def _print(out: dict, ranks: int, repeats: int) -> None:
    print(
        f"\n{ranks} ranks x {SOURCE.name}, {psutil.cpu_count()} cores, load {os.getloadavg()[0]:.1f};"
        f" medians of {repeats} interleaved repeats; memory = peak RSS over the job's process tree"
    )
    print(
        f"{'':16}{'analysis s':>11}{'CPU s':>8}{'process s':>11}{'RSS sum MB':>12}{'largest MB':>12}"
    )
    for name, r in out["arms"].items():
        cpu = f"{r['analysis_cpu_s']:8.2f}" if r["analysis_cpu_s"] is not None else f"{'—':>8}"
        print(
            f"{name:16}{r['analysis_s']:11.2f}{cpu}{r['process_s']:11.2f}"
            f"{r['rss_sum_of_peaks_mb']:12.0f}{r['rss_largest_process_mb']:12.0f}"
        )
    cpu = out["cpu_ratio_vs_hta"]
    print(f"\nspeed-up: {out['speedup_vs_hta']:.1f}x HTA (target >= 10x); cached:"
          f" {out['speedup_cached_vs_hta']:.1f}x; CPU time: HTA uses"
          f" {f'{cpu:.1f}x' if cpu else '—'} dpscope's")  # fmt: skip
    print(
        f"peak memory vs HTA (target <= 0.5): sum {out['rss_sum_ratio_vs_hta']:.2f},"
        f" largest process {out['rss_largest_ratio_vs_hta']:.2f}"
    )
    o = out["overlap_pct_rank0"]
    print(f"overlap % rank 0: dpscope {o['dpscope']:.2f}, HTA {o['hta']:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.analysis", description=__doc__.splitlines()[0]
    )
    p.add_argument("--ranks", type=int, default=8, help="copies of the trace (default 8)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (>= 3)")
    p.add_argument("--json", default=None, help="output (default reports/bench/hta.json)")
    args = p.parse_args(argv)
    if args.repeats < 3:
        p.error(f"--repeats must be >= 3 (medians of at least 3), got {args.repeats}")
    try:
        import hta  # noqa: F401  (installed by `make bench-analysis` from requirements-bench.txt)
    except ImportError:
        print(
            "error: holistictraceanalysis is not installed — run `make bench-analysis`",
            file=sys.stderr,
        )
        return 2
    path = bench_out("hta", args.json)
    with tempfile.TemporaryDirectory(prefix="dpscope-bench-") as tmp:
        cold, warm = Path(tmp, "cold"), Path(tmp, "warm")
        print(f"building {args.ranks} ranks from {SOURCE.name} ...", flush=True)
        for d in (cold, warm):
            d.mkdir()
            build_trace_set(d, args.ranks)
        cached = {CACHE_ENV: "1"}
        run_job(DPSCOPE_JOB, warm, cached)  # fills the cache: a first report
        results = interleaved(
            {
                "dpscope": lambda: run_job(DPSCOPE_JOB, cold, {CACHE_ENV: "0"}),
                "hta": lambda: run_job(HTA_JOB, cold),
                "dpscope_cached": lambda: run_job(DPSCOPE_JOB, warm, cached),
            },
            args.repeats,
        )
    out = {"ranks": args.ranks, "source": SOURCE.name, "repeats": args.repeats, **_summary(results)}
    write_json(path, out)
    _print(out, args.ranks, args.repeats)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
