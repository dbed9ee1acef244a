"""`make bench-projection`: how close `analysis project` comes on this machine, in one run.

Measures, in a fresh folder: a gloo comm benchmark (2 ranks, 1 thread each, 4 B – 4 MiB), a
single-device MLP run with `--threads 1` at per-device batch B (no profiler: every step counts)
and a 2-rank gloo DDP run with `--threads 1`, weak scaling, batch B per rank (profiled, so its
traces give the exposed communication the replay takes out of backward). Then prints:
- weak-scaling error: the single-device run projected to 2 ranks vs the measured DDP step time;
- replay error: the DDP run projected from itself at its own 2 ranks vs its measured step time.
Goal ≤ 10% for both (the issue's target); on a shared 2-core machine expect more (README).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[1]
GOAL_PCT = 10.0


def _run(module: str, args: list[str]) -> None:
    cmd = [sys.executable, "-m", module, *args]
    print(f"\n$ {' '.join(cmd)}", flush=True)
    rc = subprocess.run(cmd, cwd=REPO).returncode
    if rc != 0:
        raise SystemExit(f"bench-projection: {module} failed (exit code {rc}); see above")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workloads.bench_projection")
    parser.add_argument("--runs-dir", default="runs/bench-projection")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch", type=int, default=64, help="per-device batch B")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    root = Path(args.runs_dir) / datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    common = [
        *("--model", args.model, "--dataset", "synthetic", "--device", "cpu"),
        *("--scaling", "weak", "--batch-size", str(args.batch), "--epochs", "5"),
        *("--max-steps", str(args.steps), "--threads", str(args.threads), "--runs-dir", str(root)),
    ]
    _run(
        "workloads.bench_comm",
        [
            *("--backend", "gloo", "--nproc", "2", "--threads", str(args.threads)),
            *("--max-bytes", str(4 << 20), "--iters", "20", "--runs-dir", str(root)),
            *("--run-id", "comm"),
        ],
    )
    _run("workloads.launch", ["--mode", "single", "--run-id", "single", "--no-profile", *common])
    ddp = ["--mode", "ddp", "--backend", "gloo", "--nproc", "2", "--run-id", "ddp"]
    _run("workloads.launch", [*ddp, *common])

    from analysis.errors import AnalysisError
    from analysis.project import project

    try:
        weak = project(root / "single", root / "comm", [2], measured=[root / "ddp"])
        replay = project(root / "ddp", root / "comm", [2])
    except AnalysisError as err:
        print(f"bench-projection: error: {err}", file=sys.stderr)
        return 2
    m, r = weak["measured"][0], replay["replay"]
    print(
        f"\nbench-projection ({args.model}, batch {args.batch}/rank, --threads {args.threads}, "
        f"gloo, 2 ranks; run folders in {root})"
    )
    print(
        f"  single-device step: {1e3 * weak['inputs']['measured_step_time_s']:.2f} ms; "
        f"DDP step measured: {1e3 * m['measured_step_time_s']:.2f} ms"
    )
    for label, c in (
        ("weak-scaling projection (single -> 2 ranks)", m),
        ("replay (DDP at n=2)", r),
    ):
        ratio = c["predicted_step_time_s"] / c["measured_step_time_s"]
        print(
            f"  {label}: projected {1e3 * c['predicted_step_time_s']:.2f} ms, "
            f"ratio projected/measured {ratio:.3f}, error {c['error_pct']:+.1f}% "
            f"(goal ≤ {GOAL_PCT:g}%: {'met' if abs(c['error_pct']) <= GOAL_PCT else 'missed'})"
        )
    for w in dict.fromkeys([*weak["warnings"], *replay["warnings"]]):
        print(f"  warning: {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
