"""`make bench-family`: FSDP2, ZeRO-1 and DDP on the same `gpt` workload, measured in one run.

Three arms of one workload (model, data, global batch, steps, seed) on 2 gloo ranks, interleaved,
each a fresh `python -m workloads.launch` (`--no-profile`), `--repeats` times (>= 3):

- `ddp`: `--mode ddp`;
- `zero1`: `--mode ddp --zero 1` (ZeroRedundancyOptimizer around the same SGD);
- `fsdp`: `--mode fsdp` (FSDP2 fully_shard on gpt's blocks, then the root).

Per arm, medians over the repeats of each run's run.json numbers: `samples_per_s` (measured
steps), `model_state_mib` (the fullest rank's static memory plus FSDP2's unsharded peak, exact,
analysis.runs.family) and `peak_rss_mib` (the largest rank's peak RSS: the process, torch
included); per sharded arm its ratios to DDP of the medians: `throughput_vs_ddp` and
`model_state_vs_ddp`. The machine is shared: the host's 1-minute load average before and after
the runs is recorded with the results (and each run's own `env.host_load`), so a re-run on a
quiet machine can be told apart. Results go to reports/bench/family.json; `make docs` puts them
in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench.common import bench_out, interleaved, median, run_tree, write_json

__all__ = ["ARMS", "main"]

ARMS = {
    "ddp": ["--mode", "ddp"],
    "zero1": ["--mode", "ddp", "--zero", "1"],
    "fsdp": ["--mode", "fsdp"],
}


def _load() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def _arm(args: argparse.Namespace, runs: Path, name: str) -> dict:
    """One launch of arm `name`; its run.json numbers."""
    run_id = f"{name}-{len(list(runs.iterdir()))}"
    common = [
        "--nproc", str(args.nproc), "--backend", "gloo", "--device", "cpu",
        "--model", "gpt", "--model-args", args.model_args, "--dataset", "tokens",
        "--batch-size", str(args.batch), "--max-steps", str(args.steps), "--epochs", "1",
        "--warmup-steps", "2", "--no-profile", "--seed", "0",
    ]  # fmt: skip
    tree = run_tree(["-m", "workloads.launch", *ARMS[name], *common, "--run-id", run_id,
                     "--runs-dir", str(runs)])  # fmt: skip
    rec = json.loads((runs / run_id / "run.json").read_text())
    breakdown = rec["metrics"].get("memory_breakdown") or []
    state = max(
        (e["static_total_bytes"] + (e.get("fsdp_unsharded_peak_bytes") or 0) for e in breakdown),
        default=None,
    )
    rss = max((m.get("peak_rss_bytes") or 0 for m in rec["metrics"].get("memory") or []), default=0)
    return {
        "samples_per_s": rec["metrics"].get("samples_per_s"),
        "model_state_mib": None if state is None else state / 2**20,
        "peak_rss_mib": rss / 2**20 or None,
        "wall_s": tree["wall_s"],
        "load_avg_1m": _load(),
        "host_load": rec["env"].get("host_load"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.family", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats per arm (>= 3)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    p.add_argument("--batch", type=int, default=16, help="global batch")
    p.add_argument("--nproc", type=int, default=2, help="gloo ranks")
    p.add_argument("--model-args", default="n_layer=4,n_embd=256,n_head=4", help="gpt's")
    p.add_argument("--out", default=None, help="JSON file or folder (default reports/bench)")
    args = p.parse_args(argv)
    if args.repeats < 3:
        p.error("--repeats must be >= 3 (medians over interleaved repeats)")
    before = _load()
    with tempfile.TemporaryDirectory(prefix="bench-family-") as tmp:
        runs = Path(tmp)
        results = interleaved({n: (lambda n=n: _arm(args, runs, n)) for n in ARMS}, args.repeats)
    medians = {
        n: {k: median(rs, k) for k in ("samples_per_s", "model_state_mib", "peak_rss_mib")}
        for n, rs in results.items()
    }
    ddp = medians["ddp"]
    for name in ("zero1", "fsdp"):
        m = medians[name]
        m["throughput_vs_ddp"] = m["samples_per_s"] / ddp["samples_per_s"]
        m["model_state_vs_ddp"] = m["model_state_mib"] / ddp["model_state_mib"]
    out = {
        "bench": "family",
        "workload": {k: getattr(args, k) for k in ("steps", "batch", "nproc", "model_args")},
        "medians": medians,
        "load_avg_1m_before": before,
        "load_avg_1m_after": _load(),
        "note": "a shared machine: compare ratios within this run; re-run quiet for absolute "
        "numbers",
        "repeats": results,
    }
    path = bench_out("family", args.out)
    write_json(path, out)
    for name, m in medians.items():
        ratios = "".join(
            f", {k} {m[k]:.2f}" for k in ("throughput_vs_ddp", "model_state_vs_ddp") if k in m
        )
        print(f"{name:6s} {m['samples_per_s']:8.1f} samples/s, model state "
              f"{m['model_state_mib']:.2f} MiB, peak RSS {m['peak_rss_mib']:.0f} MiB{ratios}")  # fmt: skip
    print(f"load average (1 min) before {before}, after {out['load_avg_1m_after']}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
