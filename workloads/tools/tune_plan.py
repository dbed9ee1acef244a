"""What `make tune-ddp` tries and on what: the candidate knobs, why one is skipped, the CLI, and
the validation of the workload (everything checked before any folder exists, one line per problem).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from profiler.runfolder.errors import OneLineParser, UserError
from profiler.runfolder.layout import validate_run_id
from workloads.config import TrainConfig, config_from_namespace
from workloads.plan import batch_split
from workloads.tools import tune_stats

if TYPE_CHECKING:  # the planner imports torch; only prepare's call needs it
    from workloads.plan import Plan

__all__ = ["ACCUM_NOTE", "KNOBS", "Knob", "TuneError", "build_parser", "prepare", "skip_reason"]


class TuneError(UserError):
    """Bad input: one line that names the argument and says what to do."""


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One candidate setting: its launcher arguments, its group (one per group is combined) and
    whether it changes the arithmetic of training (compression, accumulation)."""

    name: str
    group: str
    args: tuple[str, ...]
    lossy: bool = False
    note: str = ""


KNOBS = (
    *(
        Knob(name=f"bucket-{mb}", group="bucket", args=("--bucket-cap-mb", str(mb)))
        for mb in (1, 5, 25, 100)
    ),
    Knob(
        name="grad-as-bucket-view", group="grad-as-bucket-view", args=("--gradient-as-bucket-view",)
    ),
    Knob(name="static-graph", group="static-graph", args=("--static-graph",)),
    *(
        Knob(name=h, group="comm-hook", args=("--comm-hook", h), lossy=True)
        for h in ("fp16", "bf16", "powersgd")
    ),
    *(
        Knob(name=f"accum-{k}", group="accum", args=("--grad-accum-steps", str(k)), lossy=True)
        for k in (2, 4)
    ),
)
ACCUM_NOTE = "changes the micro-batch: each device's share of a step is cut into K micro-batches"


def skip_reason(knob: Knob, cfg: TrainConfig, backend: str, replicas: int) -> str | None:
    """Why `knob` cannot be measured on this workload and machine (None: it can).

    Measured on gloo/CPU (torch 2.14): every knob runs, the bf16 hook included. The rules below are
    what the backends document: the bf16 hook needs NCCL > 2.9.6 and a GPU with bf16.
    """
    if knob.group == "grad-as-bucket-view" and cfg.gradient_as_bucket_view:
        return "already on in the baseline (ARGS)"
    if knob.group == "static-graph" and cfg.static_graph:
        return "already on in the baseline (ARGS)"
    if knob.group == "comm-hook" and cfg.comm_hook == knob.name:
        return f"the baseline already uses --comm-hook {knob.name} (ARGS)"
    if knob.name == "bf16" and backend == "nccl":
        import torch

        version = torch.cuda.nccl.version()
        if tuple(version) < (2, 9, 7):
            return f"bf16_compress_hook needs NCCL > 2.9.6; this torch has NCCL {version}"
        if not torch.cuda.is_bf16_supported():
            return "bf16_compress_hook needs bf16 support and this GPU has none"
    if knob.group == "accum":
        k = int(knob.args[1])
        if cfg.grad_accum_steps == k:
            return f"the baseline already uses --grad-accum-steps {k} (ARGS)"
        try:
            batch_split(dataclasses.replace(cfg, grad_accum_steps=k), replicas)
        except ValueError as exc:
            return str(exc)
    return None


def knob_note(knob: Knob, cfg: TrainConfig) -> str:
    """What a reader of the results should know about `knob` on this workload."""
    if knob.group == "bucket" and float(knob.args[1]) == cfg.bucket_cap_mb:
        return "same bucket size as the baseline: an A/A check of the run-to-run noise"
    if knob.group == "accum":
        return ACCUM_NOTE
    if knob.group == "comm-hook":
        return "compresses the gradients it all-reduces (lossy)"
    return ""


def select(names: str, *, accum: bool) -> list[Knob]:
    """The knobs to try: all (accumulation only with `accum`), or the named ones (comma/space list)."""
    if not names.strip():
        return [k for k in KNOBS if accum or k.group != "accum"]
    by_name = {k.name: k for k in KNOBS}
    wanted = names.replace(",", " ").split()
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise TuneError(
            f"TUNE_CANDIDATES (--candidates): unknown {', '.join(unknown)}; pick from {' '.join(by_name)}"
        )
    if not wanted:
        raise TuneError("TUNE_CANDIDATES (--candidates) is empty; name at least one candidate")
    return [by_name[n] for n in dict.fromkeys(wanted)]


def _add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The workload every trial runs (the make variables MODEL, DATASET, BATCH, ...)."""
    p.add_argument("--model", default="resnet18", help="MODEL (see workloads.launch --help)")
    p.add_argument("--dataset", default="synthetic", help="DATASET")
    p.add_argument("--batch-size", type=int, default=64, help="global batch (BATCH)")
    p.add_argument(
        "--nproc", type=int, default=None, help="DDP processes (NPROC; default: GPUs, 2 on CPU)"
    )
    p.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"), help="BACKEND")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--epochs", type=int, default=1, help="EPOCHS (a trial ends at --max-steps)")
    p.add_argument("--max-steps", type=int, default=30, help="steps per trial (STEPS, default 30)")
    p.add_argument("--seed", type=int, default=0, help="one seed for every trial (same data, init)")


def _add_tuning_arguments(p: argparse.ArgumentParser) -> None:
    """How the candidates are tried and judged."""
    p.add_argument(
        "--trials", type=int, default=3, help="trials per candidate and per baseline arm (TRIALS)"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="stop starting trials after this many seconds (TUNE_BUDGET_S; 0 = no limit)",
    )
    p.add_argument(
        "--accum",
        action="store_true",
        help="also try --grad-accum-steps 2 and 4 (TUNE_ACCUM=1); " + ACCUM_NOTE,
    )
    p.add_argument(
        "--candidates",
        default="",
        help="only these candidates (TUNE_CANDIDATES), e.g. 'bucket-1,fp16'; names: "
        + " ".join(k.name for k in KNOBS),
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=tune_stats.ALPHA,
        help="significant = exact two-sided Mann-Whitney p of the candidate's trials vs the "
        "baseline's <= this (default 0.10, the smallest p of 3 + 3 trials)",
    )
    p.add_argument(
        "--loss-tolerance",
        type=float,
        default=tune_stats.LOSS_TOLERANCE,
        help="flag a knob whose per-step loss differs from the baseline's by more (nats)",
    )
    p.add_argument(
        "--trial-timeout-s",
        type=float,
        default=1800.0,
        help="a trial running longer is ended and recorded as failed (0 = no limit)",
    )


def build_parser(prog: str = "python -m workloads.tools.tune") -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=prog,
        description="Measure DDP knobs (bucket size, gradient_as_bucket_view, static_graph, comm "
        "hooks, optionally gradient accumulation) on one workload; every candidate runs --trials "
        "times interleaved with the baseline, profiler off. Unknown arguments (ARGS) go to every "
        "trial's launcher. Accumulation (--accum) " + ACCUM_NOTE + " (global batch = per-device "
        "micro-batch x world x K stays the same).",
    )
    _add_workload_arguments(p)
    _add_tuning_arguments(p)
    p.add_argument("--runs-dir", default="runs", help="relative to the folder you run it in")
    p.add_argument(
        "--tune-id",
        default="",
        help="folder name under --runs-dir (default tune-<model>-<backend>-n<nproc>-<time>)",
    )
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def _launcher_argv(opts: argparse.Namespace, extra: list[str]) -> list[str]:
    """The launcher arguments of the baseline: our flags, then ARGS, then `--no-profile`."""
    argv = [
        *("--mode", "ddp", "--backend", opts.backend, "--device", opts.device),
        *("--model", opts.model, "--dataset", opts.dataset),
        *("--batch-size", str(opts.batch_size), "--epochs", str(opts.epochs)),
        *("--max-steps", str(opts.max_steps), "--seed", str(opts.seed)),
    ]
    if opts.nproc is not None:
        argv += ["--nproc", str(opts.nproc)]
    # ARGS come after our flags and `--no-profile` after ARGS: tuning measures unprofiled steps.
    return [*argv, *extra, "--no-profile"]


def _plan_baseline(argv: list[str]) -> tuple[TrainConfig, Plan]:
    """The baseline's config and plan by the launcher's own parser and planner (devices, backend
    and the batch split, accumulation included); one-line TuneError for anything wrong."""
    from workloads.launch.launcher import build_parser as launch_parser
    from workloads.plan import Environment, runnable_plan
    from workloads.train.data import DataError, check_available

    ns, unknown = launch_parser().parse_known_args(argv)
    if unknown:
        raise TuneError(
            f"ARGS: unknown option(s) {' '.join(unknown)}; see python -m workloads.launch --help"
        )
    if ns.nnodes != 1 or ns.mode != "ddp":
        raise TuneError("make tune-ddp tunes one-node DDP; drop --nnodes/--mode from ARGS")
    try:
        cfg = config_from_namespace(ns, mode="ddp", backend=ns.backend)
        plan = runnable_plan(
            cfg, Environment.detect(), prog="workloads.tools.tune", error=TuneError, nproc=ns.nproc
        )
        check_available(ns.dataset, ns.data_dir, download=ns.download)
    except (DataError, ValueError) as exc:
        raise TuneError(str(exc)) from None
    cfg.backend = plan.backend
    return cfg, plan


def _workload(opts: argparse.Namespace, extra: list[str], cfg: TrainConfig, plan: Plan) -> dict:
    """tune.json `workload`: what was tuned, as planned on this machine."""
    return {
        "model": opts.model,
        "dataset": opts.dataset,
        "batch_size": opts.batch_size,
        "nproc": plan.nproc,
        "backend": plan.backend,
        "device": plan.devices[0].split(":")[0],
        "epochs": opts.epochs,
        "steps": opts.max_steps,
        "seed": opts.seed,
        "trials": opts.trials,
        "warmup_steps": cfg.warmup_steps,
        "args": [*(["--device", opts.device] if opts.device != "auto" else []), *extra],
        "accum": opts.accum,
    }


def _check_numbers(opts: argparse.Namespace) -> None:
    """The tuner's own numbers: finite, and --alpha a probability strictly inside (0, 1) (at 1
    every candidate would be "significant")."""
    if not (math.isfinite(opts.alpha) and 0 < opts.alpha < 1):
        raise TuneError(
            f"--alpha must be a significance level strictly between 0 and 1 (default "
            f"{tune_stats.ALPHA}); got {opts.alpha}"
        )
    for flag, value in (
        ("TUNE_BUDGET_S (--budget-s)", opts.budget_s),
        ("--trial-timeout-s", opts.trial_timeout_s),
        ("--loss-tolerance", opts.loss_tolerance),
    ):
        if not (math.isfinite(value) and value >= 0):
            raise TuneError(f"{flag} must be a finite number >= 0; got {value}")


def prepare(
    opts: argparse.Namespace, extra: list[str]
) -> tuple[dict, list[str], list[Knob], dict[str, str]]:
    """Validate everything before any folder exists; return (workload, launcher argv, knobs, skipped)."""
    if opts.trials < 1:
        raise TuneError(f"TRIALS (--trials) must be >= 1; got {opts.trials}")
    _check_numbers(opts)
    if opts.tune_id:
        try:
            validate_run_id(opts.tune_id, "--tune-id")
        except ValueError as exc:
            raise TuneError(str(exc)) from None
    knobs = select(opts.candidates, accum=opts.accum)
    argv = _launcher_argv(opts, extra)
    cfg, plan = _plan_baseline(argv)
    skipped = {k.name: r for k in knobs if (r := skip_reason(k, cfg, plan.backend, plan.replicas))}
    knobs = [dataclasses.replace(k, note=knob_note(k, cfg)) for k in knobs]
    if len(skipped) == len(knobs):
        reasons = "; ".join(f"{n}: {r}" for n, r in skipped.items())
        raise TuneError(f"no candidate can run on this workload ({reasons})")
    argv[argv.index("--backend") + 1] = plan.backend
    if opts.nproc is None:
        argv += ["--nproc", str(plan.nproc)]
    if not opts.tune_id:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        opts.tune_id = f"tune-{opts.model}-{plan.backend}-n{plan.nproc}-{stamp}"
    return _workload(opts, extra, cfg, plan), argv, knobs, skipped
