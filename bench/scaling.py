"""`make bench-analysis` (rank scaling): `python -m analysis traces` over 8, 64 and 256 ranks.

Each set is one real trace from the reference traces in tests/data, copied once per rank with that copy's
rank (and the world size) rewritten in `distributedInfo`, so the analysis sees a real N-rank job.
The sizes run interleaved, `--repeats` times (>= 3), each in a fresh process. Per run: wall time
of the whole process and peak RSS summed over every process of its tree (the CLI and its load
workers), sampled with psutil. Medians and ratios to the smallest size go to analysis.json.

Goals: time per rank flat within 20 % across the sizes; summed peak RSS under 1 GB at 256 ranks
and flat in the rank count.
"""

from __future__ import annotations

import argparse
import json
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


def _job(trace_dir: Path) -> dict:
    """analyze_trace_dir in a fresh interpreter: process wall time, the analysis' own time
    (interpreter start-up excluded, so per-rank time is comparable across sizes) and RSS."""
    res = run_tree(["-c", DPSCOPE_JOB, str(trace_dir)])
    res["analysis_s"] = json.loads(res.pop("stdout").strip().splitlines()[-1])["seconds"]
    return res


def _rows(results: dict[str, list[dict]], sizes: list[int]) -> dict[str, dict]:
    """Medians per rank count, and ratios to the smallest count."""
    rows = {}
    for n in sizes:
        rs = results[str(n)]
        rows[str(n)] = {
            "ranks": n,
            "wall_s": median(rs, "wall_s"),
            "analysis_s": median(rs, "analysis_s"),
            "analysis_s_per_rank": median(rs, "analysis_s") / n,
            "rss_sum_of_peaks_mb": median(rs, "rss_sum_of_peaks_mb"),
            "rss_peak_of_sum_mb": median(rs, "rss_peak_of_sum_mb"),
            "repeats_wall_s": [r["wall_s"] for r in rs],
        }
    base = rows[str(sizes[0])]
    for row in rows.values():
        row["per_rank_time_ratio"] = row["analysis_s_per_rank"] / base["analysis_s_per_rank"]
        row["rss_ratio"] = row["rss_sum_of_peaks_mb"] / base["rss_sum_of_peaks_mb"]
    return rows


def _print(rows: dict[str, dict], args: argparse.Namespace) -> None:
    print(f"\n{args.source.name} copied to N ranks; {args.repeats} interleaved repeats, medians;"
          f" {psutil.cpu_count()} cores; RSS summed over every process of the job")  # fmt: skip
    print(
        f"{'ranks':>6}{'wall s':>9}{'analysis s':>12}{'s/rank':>9}{'×base':>7}{'RSS sum MB':>12}{'×base':>7}"
    )
    for r in rows.values():
        print(
            f"{r['ranks']:>6}{r['wall_s']:>9.2f}{r['analysis_s']:>12.2f}{r['analysis_s_per_rank']:>9.3f}"
            f"{r['per_rank_time_ratio']:>7.2f}{r['rss_sum_of_peaks_mb']:>12.0f}{r['rss_ratio']:>7.2f}"
        )
    print("goals: s/rank ×base within 0.8-1.2; RSS sum < 1000 MB at 256 ranks and flat")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the trace to copy")
    p.add_argument("--sizes", type=_sizes, default=[8, 64, 256], help="rank counts (8,64,256)")
    p.add_argument("--repeats", type=int, default=3, help="rounds over the sizes (>= 3)")
    p.add_argument("--json", default=None, help="output (default reports/bench/analysis.json)")
    args = p.parse_args(argv)
    if args.repeats < 3:
        p.error(f"--repeats must be >= 3 (medians of at least 3), got {args.repeats}")
    if not args.source.is_file():
        p.error(f"--source {args.source}: no such trace file; pass one from the reference traces")
    path = bench_out("analysis", args.json)
    with tempfile.TemporaryDirectory(prefix="dpscope-scaling-") as tmp:
        dirs = {}
        for n in args.sizes:
            dirs[n] = Path(tmp) / f"ranks{n}"
            dirs[n].mkdir()
            print(f"building {n} ranks from {args.source.name} ...", flush=True)
            build_trace_set(dirs[n], n, args.source)
        results = interleaved(
            {str(n): lambda d=dirs[n]: _job(d) for n in args.sizes},
            args.repeats,
        )
    rows = _rows(results, args.sizes)
    out = {
        "source": args.source.name,
        "repeats": args.repeats,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": psutil.cpu_count(),
            "os": platform.system(),
        },  # fmt: skip
        "sizes": rows,
        "goals": {"per_rank_time_ratio_within": 0.20, "rss_sum_mb_max_at_256": 1000},
    }
    write_json(path, out)
    _print(rows, args)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
