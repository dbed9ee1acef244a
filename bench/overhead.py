"""`make bench-overhead`: what the profiler and dpscope's training loop cost, measured in one run.

Three arms of the same workload (model, global batch, steps, optimizer), interleaved, each in a
fresh process, `--repeats` times (>= 3):

- `profiled`: `python -m workloads.launch --mode single` with the default profiler schedule;
  its run.json `samples_per_s` counts only the steps the profiler did not trace.
- `no_profile`: the same with `--no-profile`.
- `plain`: a hand-written loop of the same model, batch and SGD settings on tensors already in
  memory (no DataLoader, no timers, no memory sampler), timed over the same steps.

Ratios of the medians (written to overhead.json):
- `unprofiled_steps_ratio` = profiled run's samples/s ÷ no-profile run's samples/s (goal >= 0.99),
- `plain_loop_ratio` = no-profile run's samples/s ÷ the plain loop's samples/s (goal >= 0.98),
- `profiled_step_overhead_pct` = the profiled run's `metrics.profiler_overhead_pct` (median).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.common import bench_out, interleaved, median, run_tree, write_json

__all__ = ["main", "plain_loop"]

GOALS = {"unprofiled_steps_ratio": 0.99, "plain_loop_ratio": 0.98}


def plain_loop(model_name: str, batch: int, steps: int, warmup: int, device: str) -> dict:
    """samples/s of a bare training loop over `steps` - `warmup` timed steps (pre-made tensors)."""
    import torch
    import torch.nn.functional as F

    from workloads.config import TrainConfig
    from workloads.plan import cpu_cores
    from workloads.train.models import build_model

    cfg = TrainConfig()
    dev = torch.device("cuda" if device != "cpu" and torch.cuda.is_available() else "cpu")
    if dev.type == "cpu":
        torch.set_num_threads(cpu_cores())  # what dpscope's single-device run uses
    torch.manual_seed(0)
    model = build_model(model_name, num_classes=10).to(dev)
    opt = torch.optim.SGD(
        model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    xs = torch.randn(steps, batch, 3, 32, 32, device=dev)
    ys = torch.randint(0, 10, (steps, batch), device=dev)
    model.train()
    total = 0.0
    for i in range(steps):
        t = time.perf_counter()
        loss = F.cross_entropy(model(xs[i]), ys[i])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if i >= warmup:
            total += time.perf_counter() - t
    return {"samples_per_s": batch * (steps - warmup) / total}


def _launch(args: argparse.Namespace, runs: Path, name: str, extra: list[str]) -> dict:
    run_id = f"{name}-{len(list(runs.iterdir()))}"
    run_tree(
        [
            "-m", "workloads.launch", "--mode", "single", "--run-id", run_id,
            "--runs-dir", str(runs), "--model", args.model, "--dataset", "synthetic",
            "--batch-size", str(args.batch), "--max-steps", str(args.steps), "--epochs", "1",
            "--device", args.device, *extra,
        ]
    )  # fmt: skip
    rec = json.loads((runs / run_id / "run.json").read_text())
    return {
        "samples_per_s": rec["metrics"]["samples_per_s"],
        "profiler_overhead_pct": rec["metrics"].get("profiler_overhead_pct"),
        "warnings": rec.get("warnings") or [],
    }


def _plain(args: argparse.Namespace) -> dict:
    res = run_tree(
        ["-m", "bench.overhead", "--plain-worker", "--model", args.model, "--batch",
         str(args.batch), "--steps", str(args.steps), "--device", args.device]
    )  # fmt: skip
    return json.loads(res["stdout"].strip().splitlines()[-1])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.overhead", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", default="smallcnn")
    p.add_argument("--batch", type=int, default=64, help="global batch (default 64)")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per run (default 40)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--repeats", type=int, default=3, help="rounds of the three arms (>= 3)")
    p.add_argument("--json", default=None, help="output (default reports/bench/overhead.json)")
    p.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.plain_worker:
        print(json.dumps(plain_loop(args.model, args.batch, args.steps, 2, args.device)))
        return 0
    if args.repeats < 3:
        p.error(f"--repeats must be >= 3 (medians of at least 3), got {args.repeats}")
    if args.steps < 14:
        p.error(f"--steps must be >= 14 (2 warm-up, profiler steps 1-4, 8 clean), got {args.steps}")
    with tempfile.TemporaryDirectory(prefix="dpscope-bench-") as tmp:
        runs = Path(tmp)
        results = interleaved(
            {
                "profiled": lambda: _launch(args, runs, "profiled", []),
                "no_profile": lambda: _launch(args, runs, "noprof", ["--no-profile"]),
                "plain": lambda: _plain(args),
            },
            args.repeats,
        )
    med = {arm: median(rs, "samples_per_s") for arm, rs in results.items()}
    out = {
        "workload": {k: getattr(args, k) for k in ("model", "batch", "steps", "device")},
        "repeats": args.repeats,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": psutil.cpu_count(),
            "os": platform.system(),
        },
        "samples_per_s": results_table(results),
        "median_samples_per_s": med,
        "unprofiled_steps_ratio": med["profiled"] / med["no_profile"],
        "plain_loop_ratio": med["no_profile"] / med["plain"],
        "profiled_step_overhead_pct": median(results["profiled"], "profiler_overhead_pct"),
        "goals": GOALS,
    }
    path = bench_out("overhead", args.json)
    write_json(path, out)
    print(f"\n{args.model}, batch {args.batch}, {args.steps} steps, {args.repeats} interleaved repeats"
          f" ({psutil.cpu_count()} cores); medians")  # fmt: skip
    for arm, v in med.items():
        print(f"  {arm:11} {v:10.1f} samples/s")
    print(f"unprofiled_steps_ratio     {out['unprofiled_steps_ratio']:.3f} (goal >= 0.99)")
    print(f"plain_loop_ratio           {out['plain_loop_ratio']:.3f} (goal >= 0.98)")
    pct = out["profiled_step_overhead_pct"]
    print(f"profiled_step_overhead_pct {'-' if pct is None else f'{pct:.1f}'} % per traced step")
    print(f"wrote {path}")
    return 0


def results_table(results: dict[str, list[dict]]) -> dict[str, list[float]]:
    """Every repeat's samples/s per arm, in run order (the JSON keeps the spread, not just medians)."""
    return {arm: [r["samples_per_s"] for r in rs] for arm, rs in results.items()}


if __name__ == "__main__":
    sys.exit(main())
