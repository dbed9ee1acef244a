"""`make gpu-check`: on a machine with CUDA GPUs, run every mode through the launcher and check
the run folders. Prints one PASS/FAIL line per check; exits 0 only if every check passed.

Runs (all on the GPUs present, N = visible GPU count, small model, few steps):
  single (cuda:0) | dp (N GPUs) | dp with --amp bf16 (where the GPU has bf16) |
  ddp-nccl (N ranks) | ddp-gloo (N ranks, CUDA tensors over gloo) |
  ddp-nccl with --amp fp16 and the fp16 comm hook | ddp-nccl smallcnn with --sync-bn.
Checks: exit code and status, devices, one memory entry per (rank, CUDA device) with a non-zero
allocator peak, CUDA memory in steps.csv, GPU kernels and the backend's collectives in the traces,
DDP bucket info, and per-step loss parity of dp and ddp-nccl against single (the MLP has no
BatchNorm, so all three train the same model on the same global batches). With N > 1 GPUs also
projected vs measured 1 -> N GPUs: a single run at DDP's per-device batch, an nccl comm benchmark,
then `analysis project` of the single run to N ranks against ddp-nccl, and ddp-nccl's replay.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
LOSS_ATOL = 1e-4
PROJECTION_TOL_PCT = 25.0  # the goal is 10%; the check fails only well beyond it  # GPU reductions differ in order between a 64-sample batch and N shards


def _launch(runs_dir: Path, run_id: str, args: list[str]) -> int:
    cmd = [
        sys.executable,
        "-m",
        "workloads.launch",
        "--runs-dir",
        str(runs_dir),
        "--run-id",
        run_id,
        *args,
    ]
    print(f"\n$ {' '.join(cmd)}", flush=True)
    return subprocess.run(cmd, cwd=REPO).returncode


def _trace_names(run_dir: Path, run: dict) -> tuple[set[str], set[str]]:
    """(names of GPU kernels, names of all other events) over the run's traces."""
    kernels, others = set(), set()
    for rel in run.get("traces", []):
        with gzip.open(run_dir / rel, "rt", encoding="utf-8") as f:
            for ev in json.load(f).get("traceEvents", []):
                name = str(ev.get("name", ""))
                (kernels if ev.get("cat") == "kernel" else others).add(name)
    return kernels, others


def _matmul_input_types(run_dir: Path, run: dict) -> set[str]:
    """Input dtypes of the traced `aten::addmm` calls (the MLP's linear layers)."""
    types: set[str] = set()
    for rel in run.get("traces", []):
        with gzip.open(run_dir / rel, "rt", encoding="utf-8") as f:
            for ev in json.load(f).get("traceEvents", []):
                if ev.get("name") == "aten::addmm":
                    types.update(str(t) for t in ev.get("args", {}).get("Input type", [])[:3])
    return types


def _losses(run_dir: Path) -> dict[int, float]:
    """Per step: the mean over ranks of each rank's batch-mean loss (= the global-batch loss)."""
    per_step: dict[int, list[float]] = {}
    with open(run_dir / "steps.csv", newline="") as f:
        for row in csv.DictReader(f):
            per_step.setdefault(int(row["step"]), []).append(float(row["loss"]))
    return {s: sum(v) / len(v) for s, v in per_step.items()}


class Checker:
    """Collects PASS/FAIL lines."""

    def __init__(self) -> None:
        self.failed = 0
        self.passed = 0

    def __call__(self, label: str, name: str, ok: bool, detail: str = "") -> bool:
        print(
            f"{'PASS' if ok else 'FAIL'}  {label:<16} {name}{'' if ok else f'  ({detail})'}",
            flush=True,
        )
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok


def check_run(
    check: Checker,
    label: str,
    run_dir: Path,
    rc: int,
    *,
    mode: str,
    backend: str,
    ranks: int,
    gpus: int,
) -> bool:
    """Check one finished run folder; return whether it is usable for the parity check."""
    if not check(label, "launcher exit code 0", rc == 0, f"exit code {rc}, see {run_dir / 'logs'}"):
        return False
    run = json.loads((run_dir / "run.json").read_text())
    if not check(label, "status ok", run["status"] == "ok", str(run.get("error"))):
        return False
    cfg, metrics = run["config"], run["metrics"]
    want_devices = [f"cuda:{i}" for i in range(gpus if mode == "dp" else ranks)]
    check(label, f"devices {want_devices}", cfg["devices"] == want_devices, str(cfg["devices"]))
    want_mem = (
        {(0, d) for d in want_devices} if mode == "dp" else {(r, f"cuda:{r}") for r in range(ranks)}
    )
    got_mem = {(m["rank"], m["device"]) for m in metrics["memory"]}
    check(
        label,
        "memory entry per rank and CUDA device",
        got_mem == want_mem,
        f"got {sorted(got_mem)}",
    )
    check(
        label,
        "non-zero allocator peaks",
        all((m["peak_allocated_bytes"] or 0) > 0 for m in metrics["memory"]),
        str(metrics["memory"]),
    )
    with open(run_dir / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    check(
        label,
        "cuda_allocated_bytes in steps.csv",
        bool(rows) and all(r["cuda_allocated_bytes"] for r in rows),
    )
    kernels, others = _trace_names(run_dir, run)
    check(label, "GPU kernels in traces", bool(kernels), f"{len(run['traces'])} trace files")
    if mode == "ddp":
        names = kernels | others
        if backend == "nccl":
            found = any("nccl" in n.lower() for n in names)
        else:
            found = any(n.startswith("gloo:") for n in names)
        check(label, f"{backend} collectives in traces", found, "no collective event names found")
        ddp = metrics.get("ddp") or {}
        check(label, "DDP bucket info", ddp.get("num_buckets", 0) >= 1, str(ddp))
    return True


def _projection_check(
    check: Checker, runs_dir: Path, stamp: str, gpus: int, usable: dict[str, Path]
) -> None:
    """Projected vs measured 1 -> N GPUs: an nccl comm benchmark, then `analysis project` of the
    single-GPU run to N ranks against the measured ddp-nccl run, and the DDP run's replay."""
    from analysis.errors import AnalysisError
    from analysis.project import project

    comm = runs_dir / f"gpu-comm-nccl-{stamp}"
    cmd = [sys.executable, "-m", "workloads.bench_comm", "--backend", "nccl", "--nproc", str(gpus)]
    cmd += ["--runs-dir", str(runs_dir), "--run-id", comm.name, "--iters", "10"]
    print(f"\n$ {' '.join(cmd)}", flush=True)
    if not check("projection", "bench-comm nccl", subprocess.run(cmd, cwd=REPO).returncode == 0):
        return
    try:
        ranks = sorted({1, 2, gpus})
        out = project(
            usable["single"], comm, ranks, measured=[usable["ddp-nccl"]],
            batch_runs=[usable["single-b32"]],
        )  # fmt: skip
        replay = project(usable["ddp-nccl"], comm, [gpus])["replay"]
    except AnalysisError as err:
        check("projection", "analysis project", False, str(err))
        return
    for label, c in ((f"projected 1 -> {gpus} GPUs", out["measured"][0]), ("replay", replay)):
        check(
            "projection",
            f"{label}: {1e3 * c['predicted_step_time_s']:.2f} ms vs measured "
            f"{1e3 * c['measured_step_time_s']:.2f} ms, error {c['error_pct']:+.1f}% (goal 10%)",
            abs(c["error_pct"]) <= PROJECTION_TOL_PCT,
            f"beyond {PROJECTION_TOL_PCT}%",
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workloads.gpu_check", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--runs-dir", default="runs/gpu-check", help="where the check runs go")
    parser.add_argument(
        "--model", default="mlp", help="model for the main runs (mlp: parity is exact)"
    )
    # 13: 2 warm-up steps and the profiler window (steps 1-4) leave 8 unprofiled measured steps.
    parser.add_argument("--max-steps", type=int, default=13)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "gpu-check: error: torch sees no CUDA device; run this on a machine with NVIDIA GPUs",
            file=sys.stderr,
        )
        return 2
    gpus = torch.cuda.device_count()
    print(
        f"gpu-check: {gpus} GPU(s): {', '.join(torch.cuda.get_device_name(i) for i in range(gpus))}"
    )
    runs_dir = Path(args.runs_dir)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    # The global batch must split evenly over the GPUs (strong scaling).
    common = [
        "--model",
        args.model,
        "--dataset",
        "synthetic",
        "--epochs",
        "1",
        "--max-steps",
        str(args.max_steps),
        "--batch-size",
        str(32 * gpus),
        "--seed",
        "0",
    ]

    def argv(mode: str, backend: str = "auto", *extra: str) -> list[str]:
        """Launcher arguments for one check run; `extra` comes last, so it overrides `common`."""
        ddp = ["--backend", backend, "--nproc", str(gpus)] if mode == "ddp" else []
        dp = ["--nproc", str(gpus)] if mode == "dp" else []
        return ["--mode", mode, *ddp, *dp, *common, *extra]

    plan = [
        ("single", "single", "none", 1, argv("single")),
        ("dp", "dp", "none", 1, argv("dp")),
        ("ddp-nccl", "ddp", "nccl", gpus, argv("ddp", "nccl")),
        ("ddp-gloo", "ddp", "gloo", gpus, argv("ddp", "gloo")),
        (
            "ddp-nccl-fp16",
            "ddp",
            "nccl",
            gpus,
            argv("ddp", "nccl", *"--amp fp16 --comm-hook fp16".split()),
        ),
        (
            "ddp-nccl-syncbn",
            "ddp",
            "nccl",
            gpus,
            argv("ddp", "nccl", *"--model smallcnn --sync-bn".split()),
        ),
    ]
    if gpus > 1:  # compute at DDP's per-device batch, for the projection check (no linear guess)
        plan.append(
            ("single-b32", "single", "none", 1, argv("single", "auto", "--batch-size", "32"))
        )
    if torch.cuda.is_bf16_supported():  # what autocast itself requires for bf16 on CUDA
        # DataParallel's replica threads must keep bf16 (autocast's dtype is thread-local).
        plan.insert(2, ("dp-bf16", "dp", "none", 1, argv("dp", "auto", "--amp", "bf16")))
    check = Checker()
    usable: dict[str, Path] = {}
    for label, mode, backend, ranks, launch_args in plan:
        run_dir = runs_dir / f"gpu-{label}-{stamp}"
        rc = _launch(runs_dir, run_dir.name, launch_args)
        if check_run(check, label, run_dir, rc, mode=mode, backend=backend, ranks=ranks, gpus=gpus):
            usable[label] = run_dir
            if label == "dp-bf16" and args.model == "mlp":
                types = _matmul_input_types(run_dir, json.loads((run_dir / "run.json").read_text()))
                check(label, "matmuls run in bf16", types == {"c10::BFloat16"}, str(types))
    if "single" in usable and args.model == "mlp":
        reference = _losses(usable["single"])
        for label in ("dp", "ddp-nccl"):
            if label in usable:
                other = _losses(usable[label])
                worst = max(
                    (abs(other.get(s, float("inf")) - v) for s, v in reference.items()), default=0.0
                )
                check(
                    label,
                    f"per-step loss matches single (max diff {worst:.2e})",
                    worst <= LOSS_ATOL,
                    f"> {LOSS_ATOL}",
                )
    if gpus > 1 and {"single", "single-b32", "ddp-nccl"} <= usable.keys():
        _projection_check(check, runs_dir, stamp, gpus, usable)
    print(f"\ngpu-check: {check.passed} passed, {check.failed} failed; run folders in {runs_dir}")
    return 0 if check.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
