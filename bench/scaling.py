"""`make bench-analysis` (rank scaling): the trace analysis over 8 to 1,024 ranks, serial, with the
local process pool (the default) and on a Dask LocalCluster (`--executor dask`).

Each set is one real trace from the reference traces in tests/data, copied once per rank with that
copy's rank (and the world size) rewritten in `distributedInfo`, so the analysis sees a real
N-rank job. Every (size, executor) pair runs interleaved, `--repeats` times (>= 3), each in a
fresh process. Per run: wall time of the whole process, the analysis' own time, and peak RSS:
summed over every process of its tree, of the process started (the client, which merges), and
of the largest process below it (a worker). Medians and ratios to the smallest size go to
analysis.json.

Goals: time per rank flat within 20 % across the sizes (process pool); summed peak RSS under
1 GB at 256 ranks and flat in the rank count; a worker's peak RSS flat in the rank count (it
holds one trace at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import psutil

from bench.analysis import DPSCOPE_JOB, build_trace_set
from bench.common import TEST_DATA, bench_out, interleaved, median, run_tree, write_json

__all__ = ["main"]

DEFAULT_SOURCE = TEST_DATA / "hta" / "trace_filter" / "sampled_rank-0.json.gz"


def _sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sizes wants comma-separated ints, got {text!r}"
        ) from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"--sizes must be positive, got {text!r}")
    return sizes


EXECUTORS = {"serial": ("process", "1"), "process": ("process", "0"), "dask": ("dask", "0")}


def _job(trace_dir: Path, arm: str) -> dict:
    """analyze_trace_dir in a fresh interpreter: process wall time, the analysis' own time
    (interpreter start-up excluded, so per-rank time is comparable across sizes) and RSS."""
    kind, workers = EXECUTORS[arm]
    argv = ["-c", DPSCOPE_JOB, str(trace_dir), kind, *([workers] if workers != "0" else [])]
    res = run_tree(argv, env={"DPSCOPE_TRACE_CACHE": "0"})
    res["analysis_s"] = json.loads(res.pop("stdout").strip().splitlines()[-1])["seconds"]
    return res


def _rows(results: dict[str, list[dict]], sizes: list[int], arms: list[str]) -> dict[str, dict]:
    """Medians per (rank count, executor), and ratios to the smallest count."""
    rows = {}
    for n in sizes:
        for arm in arms:
            rs = results[f"{n}/{arm}"]
            rows[f"{n}/{arm}"] = {
                "ranks": n,
                "executor": arm,
                "wall_s": median(rs, "wall_s"),
                "analysis_s": median(rs, "analysis_s"),
                "analysis_s_per_rank": median(rs, "analysis_s") / n,
                "rss_sum_of_peaks_mb": median(rs, "rss_sum_of_peaks_mb"),
                "rss_peak_of_sum_mb": median(rs, "rss_peak_of_sum_mb"),
                "rss_client_peak_mb": median(rs, "rss_root_peak_mb"),
                "rss_worker_peak_mb": median(rs, "rss_worker_peak_mb"),
                "repeats_wall_s": [r["wall_s"] for r in rs],
            }
    for arm in arms:
        base = rows[f"{sizes[0]}/{arm}"]
        for n in sizes:
            row = rows[f"{n}/{arm}"]
            row["per_rank_time_ratio"] = row["analysis_s_per_rank"] / base["analysis_s_per_rank"]
            row["rss_ratio"] = row["rss_sum_of_peaks_mb"] / base["rss_sum_of_peaks_mb"]
    return rows


def _print(rows: dict[str, dict], args: argparse.Namespace) -> None:
    print(f"\n{args.source.name} copied to N ranks; {args.repeats} interleaved repeats, medians;"
          f" {psutil.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; RSS in MB")  # fmt: skip
    print(f"{'ranks':>6} {'executor':<8}{'wall s':>8}{'analysis s':>11}{'s/rank':>8}{'×base':>6}"
          f"{'sum':>7}{'client':>8}{'worker':>8}")  # fmt: skip
    for r in rows.values():
        print(
            f"{r['ranks']:>6} {r['executor']:<8}{r['wall_s']:>8.2f}{r['analysis_s']:>11.2f}"
            f"{r['analysis_s_per_rank']:>8.3f}{r['per_rank_time_ratio']:>6.2f}"
            f"{r['rss_sum_of_peaks_mb']:>7.0f}{r['rss_client_peak_mb']:>8.0f}"
            f"{r['rss_worker_peak_mb']:>8.0f}"
        )
    print("goals: s/rank ×base within 0.8-1.2; RSS sum < 1000 MB at 256 ranks; worker RSS flat")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the trace to copy")
    p.add_argument(
        "--sizes", type=_sizes, default=[8, 64, 256, 1024], help="rank counts (8,64,256,1024)"
    )
    p.add_argument(
        "--executors",
        default="serial,process,dask",
        help="arms: serial (--workers 1), process (the local pool), dask (a LocalCluster)",
    )
    p.add_argument("--repeats", type=int, default=3, help="rounds over the sizes (>= 3)")
    p.add_argument("--json", default=None, help="output (default reports/bench/analysis.json)")
    args = p.parse_args(argv)
    if args.repeats < 3:
        p.error(f"--repeats must be >= 3 (medians of at least 3), got {args.repeats}")
    if not args.source.is_file():
        p.error(f"--source {args.source}: no such trace file; pass one from the reference traces")
    arms = [a for a in args.executors.split(",") if a]
    if not arms or set(arms) - set(EXECUTORS):
        p.error(f"--executors: pick from {', '.join(EXECUTORS)}, got {args.executors!r}")
    path = bench_out("analysis", args.json)
    with tempfile.TemporaryDirectory(prefix="dpscope-scaling-") as tmp:
        dirs = {}
        for n in args.sizes:
            dirs[n] = Path(tmp) / f"ranks{n}"
            dirs[n].mkdir()
            print(f"building {n} ranks from {args.source.name} ...", flush=True)
            build_trace_set(dirs[n], n, args.source)
        results = interleaved(
            {f"{n}/{a}": lambda d=dirs[n], a=a: _job(d, a) for n in args.sizes for a in arms},
            args.repeats,
        )
    rows = _rows(results, args.sizes, arms)
    out = {
        "source": args.source.name,
        "repeats": args.repeats,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": psutil.cpu_count(),
            "os": platform.system(),
        },  # fmt: skip
        "sizes": rows,
        "goals": {
            "per_rank_time_ratio_within": 0.20,
            "rss_sum_mb_max_at_256": 1000,
            "worker_rss": "flat in the rank count",
        },
    }
    write_json(path, out)
    _print(rows, args)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
