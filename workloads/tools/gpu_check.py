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
then `analysis project` of the single run to N ranks against ddp-nccl, and ddp-nccl's replay;
and a hang (rank 1 stops at step 3; --collective-timeout 30) that the error must name from NCCL's
flight recorder: the all_reduce rank 1 never entered, with its number.
The memory breakdown (MLP runs) on the CUDA allocator: parameters = gradients = momentum =
Σ numel × 4 (DP: all on cuda:0), DDP buckets ≈ gradients (0 with the view, from an extra
ddp-nccl --gradient-as-bucket-view run), the allocator's bytes at the end of a step at least the
static floor + the batch, DDP − single on the allocator = the buckets within 5%, and the traced
forward peak within 10% of the hand count.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

from analysis.runs.compare import compare_runs
from profiler.runfolder.errors import InputError
from profiler.runfolder.layout import RUN_JSON, STEPS_CSV
from profiler.runfolder.records import read_record
from profiler.runfolder.schema import RunRecord
from profiler.runfolder.steps import read_steps
from workloads.launch.child import child_env, user_path
from workloads.train.models import build_model

LOSS_ATOL = 1e-4  # GPU reductions differ in order between a 64-sample batch and N shards
PROJECTION_TOL_PCT = 25.0  # the goal is 10%; the check fails only well beyond it
# Bytes one MLP sample occupies on the device: a 3×32×32 fp32 image and an int64 label.
BATCH_SAMPLE_BYTES = 3 * 32 * 32 * 4 + 8


def _launch(runs_dir: Path, run_id: str, args: list[str], **env: str) -> int:
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
    return subprocess.run(cmd, env=child_env(**env)).returncode


def _trace_names(run_dir: Path, run: RunRecord) -> tuple[set[str], set[str]]:
    """(names of GPU kernels, names of all other events) over the run's traces."""
    kernels, others = set(), set()
    for rel in run.traces:
        with gzip.open(run_dir / rel, "rt", encoding="utf-8") as f:
            for ev in json.load(f).get("traceEvents", []):
                name = str(ev.get("name", ""))
                (kernels if ev.get("cat") == "kernel" else others).add(name)
    return kernels, others


def _matmul_input_types(run_dir: Path, run: RunRecord) -> set[str]:
    """Input dtypes of the traced `aten::addmm` calls (the MLP's linear layers)."""
    types: set[str] = set()
    for rel in run.traces:
        with gzip.open(run_dir / rel, "rt", encoding="utf-8") as f:
            for ev in json.load(f).get("traceEvents", []):
                if ev.get("name") == "aten::addmm":
                    types.update(str(t) for t in ev.get("args", {}).get("Input type", [])[:3])
    return types


def _losses(run_dir: Path) -> dict[int, float]:
    """Per step: the mean over ranks of each rank's batch-mean loss (= the global-batch loss)."""
    per_step: dict[int, list[float]] = {}
    for row in read_steps(run_dir / STEPS_CSV):
        per_step.setdefault(row.step, []).append(float(row.loss))
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
    run, raw = read_record(run_dir / RUN_JSON)
    if not check(label, "status ok", run.status == "ok", str(raw.get("error"))):
        return False
    cfg, metrics = run.config, run.metrics
    want_devices = [f"cuda:{i}" for i in range(gpus if mode == "dp" else ranks)]
    check(label, f"devices {want_devices}", cfg.devices == want_devices, str(cfg.devices))
    want_mem = (
        {(0, d) for d in want_devices} if mode == "dp" else {(r, f"cuda:{r}") for r in range(ranks)}
    )
    got_mem = {(m.rank, m.device) for m in metrics.memory}
    check(
        label,
        "memory entry per rank and CUDA device",
        got_mem == want_mem,
        f"got {sorted(got_mem)}",
    )
    check(
        label,
        "non-zero allocator peaks",
        all((m.peak_allocated_bytes or 0) > 0 for m in metrics.memory),
        str(raw["metrics"]["memory"]),
    )
    rows = read_steps(run_dir / STEPS_CSV)
    check(
        label,
        "cuda_allocated_bytes in steps.csv",
        bool(rows) and all(r.cuda_allocated_bytes for r in rows),
    )
    kernels, others = _trace_names(run_dir, run)
    check(label, "GPU kernels in traces", bool(kernels), f"{len(run.traces)} trace files")
    if mode == "ddp":
        names = kernels | others
        if backend == "nccl":
            found = any("nccl" in n.lower() for n in names)
        else:
            found = any(n.startswith("gloo:") for n in names)
        check(label, f"{backend} collectives in traces", found, "no collective event names found")
        ddp = raw["metrics"].get("ddp") or {}  # not typed: passes verbatim
        check(label, "DDP bucket info", ddp.get("num_buckets", 0) >= 1, str(ddp))
    return True


def _projection_check(
    check: Checker, runs_dir: Path, stamp: str, gpus: int, usable: dict[str, Path]
) -> None:
    """Projected vs measured 1 -> N GPUs: an nccl comm benchmark, then `analysis project` of the
    single-GPU run to N ranks against the measured ddp-nccl run, and the DDP run's replay."""
    from analysis.project.projection import project

    comm = runs_dir / f"gpu-comm-nccl-{stamp}"
    cmd = [sys.executable, "-m", "workloads.comm.bench", "--backend", "nccl", "--nproc", str(gpus)]
    cmd += ["--runs-dir", str(runs_dir), "--run-id", comm.name, "--iters", "10"]
    print(f"\n$ {' '.join(cmd)}", flush=True)
    rc = subprocess.run(cmd, env=child_env()).returncode
    if not check("projection", "bench-comm nccl", rc == 0):
        return
    try:
        ranks = sorted({1, 2, gpus})
        out = project(
            usable["single"], comm, ranks, measured=[usable["ddp-nccl"]],
            batch_runs=[usable["single-b32"]],
        )  # fmt: skip
        replay = project(usable["ddp-nccl"], comm, [gpus])["replay"]
    except InputError as err:
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


def check_memory(check: Checker, label: str, run_dir: Path, *, mode: str, batch: int) -> None:
    """The memory breakdown of an MLP run against the model's sizes and the CUDA allocator.

    `batch` is the per-device batch. Hand counts: the MLP's forward peak is when the second ReLU
    writes its output (the first ReLU's output, Linear 2's output and the new one are alive:
    3 × batch × hidden × 4 bytes); the bytes allocated at the end of a step (after
    zero_grad(set_to_none=True)) are at least the static floor plus the step's batch (inputs
    fp32, labels int64).
    """
    mlp = build_model("mlp", num_classes=10)
    params = sum(p.numel() * 4 for p in mlp.parameters())
    (run,) = compare_runs([run_dir], progress=False)["runs"]
    entries = run["memory_breakdown"]
    owners = [e for e in entries if e["parameters_bytes"]]  # DP: only cuda:0 holds the module
    check(label, "memory breakdown entries", bool(entries) and bool(owners), str(entries))
    for e in owners:
        where = f"rank {e['rank']} {e['device']}"
        for key in ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes"):
            check(label, f"{where} {key} = Σ numel × 4", e[key] == params, f"{e[key]} != {params}")
        buckets, grads = e["ddp_buckets_bytes"], e["gradients_bytes"]
        if mode == "ddp-view":
            check(label, f"{where} DDP buckets 0 with the view", buckets == 0, str(buckets))
        elif mode == "ddp":
            ok = abs(buckets - grads) <= 0.05 * grads
            check(label, f"{where} DDP buckets ≈ gradients (5%)", ok, f"{buckets} vs {grads}")
        hand = 3 * batch * mlp[1].out_features * 4
        fwd = e["forward_peak_bytes"]
        ok = fwd is not None and abs(fwd - hand) <= 0.10 * hand
        check(label, f"{where} forward peak ≈ hand count (10%)", ok, f"{fwd} vs {hand}")
    if mode == "dp":
        return  # GPU 0 also holds DP's gathered outputs: no simple hand count at the step's end
    allocated = _end_of_step_allocated(run_dir)
    for e in owners:
        grads_freed = mode != "ddp-view"  # with the view the gradients are DDP's buckets: kept
        floor = e["static_total_bytes"] - (e["gradients_bytes"] if grads_freed else 0)
        want = floor + batch * BATCH_SAMPLE_BYTES
        got = allocated.get(e["rank"], 0)
        # One-sided: the allocator also holds cuBLAS/cuBLASLt workspaces (kept per handle and
        # stream), which no tensor owns; the DDP-vs-single check below cancels them exactly.
        ok = got >= want
        check(label, f"rank {e['rank']} allocator ≥ floor + batch", ok, f"{got} < {want}")


def _end_of_step_allocated(run_dir: Path) -> dict[int, int]:
    """Per rank, `torch.cuda.memory_allocated` after its last step (steps.csv)."""
    return {r.rank: int(r.cuda_allocated_bytes) for r in read_steps(run_dir / STEPS_CSV)}


def check_ddp_vs_single(check: Checker, single: Path, ddp: Path, *, gpus: int) -> None:
    """On the CUDA allocator, DDP's rank 0 holds its unshared buckets more than the single run at
    the end of a step, up to the batch difference (single: 32 × gpus samples, a rank: 32):
    parameters, momentum and the cuBLAS workspaces are the same in both and cancel."""
    (run,) = compare_runs([ddp], progress=False)["runs"]
    buckets = next(e["ddp_buckets_bytes"] for e in run["memory_breakdown"] if e["rank"] == 0)
    delta = _end_of_step_allocated(ddp)[0] - _end_of_step_allocated(single)[0]
    want = buckets + (32 - 32 * gpus) * BATCH_SAMPLE_BYTES
    ok = abs(delta - want) <= 0.05 * buckets
    check("ddp-nccl", "allocator: DDP − single = buckets (5%)", ok, f"{delta} vs {want}")


def _check_plan(args: argparse.Namespace, gpus: int) -> list[tuple[str, str, str, int, list[str]]]:
    """(label, mode, backend, ranks, launcher arguments) of every check run."""
    # The global batch must split evenly over the GPUs (strong scaling).
    common = [
        *("--model", args.model, "--dataset", "synthetic", "--epochs", "1"),
        *("--max-steps", str(args.max_steps), "--batch-size", str(32 * gpus), "--seed", "0"),
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
        ("ddp-nccl-fp16", "ddp", "nccl", gpus,
         argv("ddp", "nccl", *"--amp fp16 --comm-hook fp16".split())),
        ("ddp-nccl-view", "ddp", "nccl", gpus, argv("ddp", "nccl", "--gradient-as-bucket-view")),
        ("ddp-nccl-syncbn", "ddp", "nccl", gpus,
         argv("ddp", "nccl", *"--model smallcnn --sync-bn".split())),
    ]  # fmt: skip
    if gpus > 1:  # compute at DDP's per-device batch, for the projection check (no linear guess)
        plan.append(
            ("single-b32", "single", "none", 1, argv("single", "auto", "--batch-size", "32"))
        )
    if torch.cuda.is_bf16_supported():  # what autocast itself requires for bf16 on CUDA
        # DataParallel's replica threads must keep bf16 (autocast's dtype is thread-local).
        plan.insert(2, ("dp-bf16", "dp", "none", 1, argv("dp", "auto", "--amp", "bf16")))
    return plan


def _run_checks(
    check: Checker, args: argparse.Namespace, runs_dir: Path, stamp: str, gpus: int
) -> dict[str, Path]:
    """Launch and check every planned run; the run folders that passed, by label."""
    usable: dict[str, Path] = {}
    for label, mode, backend, ranks, launch_args in _check_plan(args, gpus):
        run_dir = runs_dir / f"gpu-{label}-{stamp}"
        rc = _launch(runs_dir, run_dir.name, launch_args)
        if not check_run(
            check, label, run_dir, rc, mode=mode, backend=backend, ranks=ranks, gpus=gpus
        ):
            continue
        usable[label] = run_dir
        if args.model == "mlp" and label in ("single", "dp", "ddp-nccl", "ddp-nccl-view"):
            kind = "ddp-view" if label == "ddp-nccl-view" else mode
            # Per-device batch: single takes the whole global batch, a DP replica or a
            # DDP rank 32 (DP on cuda:0 runs its own replica's forward there).
            batch = 32 * gpus if mode == "single" else 32
            check_memory(check, label, run_dir, mode=kind, batch=batch)
        if label == "dp-bf16" and args.model == "mlp":
            types = _matmul_input_types(run_dir, read_record(run_dir / RUN_JSON)[0])
            check(label, "matmuls run in bf16", types == {"c10::BFloat16"}, str(types))
    return usable


def _hang_check(check: Checker, runs_dir: Path, stamp: str, gpus: int) -> None:
    """NCCL's flight recorder names a hang: rank 1 stops before step 3's backward (the fault
    hooks), so rank 0 waits in that step's gradient all_reduce until the collective timeout;
    the run's error names that all_reduce, its number and the rank that never entered it."""
    label, run_id = "ddp-nccl-hang", f"gpu-ddp-nccl-hang-{stamp}"
    argv = f"--mode ddp --backend nccl --nproc {gpus} --model mlp --dataset synthetic "
    argv += f"--max-steps 8 --batch-size {32 * gpus} --no-profile --collective-timeout 30"
    rc = _launch(runs_dir, run_id, argv.split(), DPSCOPE_HANG_RANK="1", DPSCOPE_HANG_STEP="3")
    check(label, "the hung job failed", rc != 0, f"exit code {rc}")
    try:
        error = read_record(runs_dir / run_id / RUN_JSON)[1].get("error") or {}
    except InputError as err:  # no record: a FAIL line, never the whole check's traceback
        error = {"kind": None, "message": str(err)}
    fr, detail = error.get("flight_recorder") or {}, f"{error.get('kind')}: {error.get('message')}"
    named = (error.get("kind"), error.get("rank"), fr.get("collective"), fr.get("never_entered"))
    want = ("hang", 1, "all_reduce", [1])
    check(label, "hang: rank 1 never entered the all_reduce", named == want, detail)
    check(label, "flight recorder: the collective's number", isinstance(fr.get("seq"), int), detail)


def _loss_parity(check: Checker, usable: dict[str, Path]) -> None:
    """dp and ddp-nccl train the same model on the same global batches as single: same losses."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workloads.tools.gpu_check", description=__doc__.splitlines()[0]
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
    runs_dir = user_path(args.runs_dir)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    check = Checker()
    usable = _run_checks(check, args, runs_dir, stamp, gpus)
    if "single" in usable and "ddp-nccl" in usable and args.model == "mlp":
        check_ddp_vs_single(check, usable["single"], usable["ddp-nccl"], gpus=gpus)
    if "single" in usable and args.model == "mlp":
        _loss_parity(check, usable)
    if gpus > 1 and {"single", "single-b32", "ddp-nccl"} <= usable.keys():
        _projection_check(check, runs_dir, stamp, gpus, usable)
    if gpus > 1:
        _hang_check(check, runs_dir, stamp, gpus)
    print(f"\ngpu-check: {check.passed} passed, {check.failed} failed; run folders in {runs_dir}")
    return 0 if check.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
