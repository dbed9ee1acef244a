"""The training entrypoint for every mode: `python -m workloads.train` (what torchrun starts).

One loop for single, DataParallel and DDP: the mode only changes the RunContext (decided once)
and the wrapper (workloads.train.context.wrap_model). Each optimizer step is timed in four phases
(data, forward, backward, optimizer), advances the profiler schedule and samples memory. At the
end every rank's step rows and memory peaks are gathered to rank 0, which writes steps.csv
and run.json atomically (workloads.train.finish). Each rank logs to `logs/rank<r>.log`; a rank that
raises also writes `logs/rank<r>.error.json` (with its `kind`, workloads.launch.faults) and exits 1 so
the launcher can name it. Every phase boundary rewrites `logs/rank<r>.heartbeat.json`
(workloads.launch.heartbeat); `--checkpoint-every` and a torchrun restart resume through
workloads.train.checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from profiler.memory import MemoryTracker
from profiler.memory_breakdown import StaticMemory
from profiler.session import ProfileConfig, ProfilerSession
from profiler.timers import StepTimer
from workloads.config import (
    OneLineParser,
    TrainConfig,
    add_config_arguments,
    config_from_namespace,
    default_run_id,
)
from workloads.launch import faults
from workloads.launch.heartbeat import Heartbeat
from workloads.launch.runlog import rank_log, write_error_record
from workloads.train.checkpoint import LoopState, checkpoint_now, resume, save_final
from workloads.train.context import (
    RunContext,
    init_context,
    teardown,
    unwrap_model,
    wrap_model,
)
from workloads.train.data import GlobalBatchSampler, build_datasets, eval_loader, train_loader
from workloads.train.finish import finish
from workloads.train.models import build_model

__all__ = ["evaluate", "main", "train"]


def _set_threads(ctx: RunContext) -> int:
    """The plan's threads per rank: `--threads N`, else CPU ranks share the cores and GPU runs
    keep torch's default."""
    torch.set_num_threads(ctx.plan.threads_per_rank)
    return torch.get_num_threads()


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader, ctx: RunContext, *, epoch: int, on_batch=None
) -> dict:
    """Test loss / top-1 / top-5 over the whole test split. Each rank evaluates its shard with
    the unwrapped module (no collectives per batch) and the sums are all-reduced, so every mode
    reports the same numbers."""
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=ctx.device)  # loss, top1, top5, samples
    for x, y in loader:
        if on_batch:  # a long eval still shows progress to the launcher's hang watchdog
            on_batch()
        x, y = x.to(ctx.device), y.to(ctx.device)
        out = model(x).float()
        top = out.topk(min(5, out.shape[1]), dim=1).indices
        sums += torch.stack(
            [
                F.cross_entropy(out, y, reduction="sum").double(),
                (top[:, 0] == y).sum().double(),
                (top == y[:, None]).any(dim=1).sum().double(),
                torch.tensor(float(len(y)), dtype=torch.float64, device=ctx.device),
            ]
        )
    if ctx.mode == "ddp":
        dist.all_reduce(sums)
    model.train()
    loss, top1, top5, n = sums.tolist()
    return {
        "epoch": epoch,
        "test_loss": loss / n,
        "top1_pct": 100.0 * top1 / n,
        "top5_pct": 100.0 * top5 / n,
        "samples": int(n),
    }


def _forward_backward(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    accum: int,
    timer: StepTimer,
    scaler: torch.amp.GradScaler,
    amp: torch.dtype | None,
    on_backward: Callable[[], None] | None = None,
) -> torch.Tensor:
    """Forward and backward of one optimizer step over `accum` micro-batches; returns the loss
    over the rank's whole share (the mean of the equal-sized micro-batch means).

    Micro-batch k is the k-th contiguous chunk of this rank's share, i.e. positions
    [k*m, (k+1)*m) of it (m = share / accum), so the step still covers exactly the sampler's
    global batch. Each micro-batch loss is scaled by 1/accum so the accumulated gradient is the
    share's mean gradient; under DDP all but the last micro-batch run under `no_sync()`, so the
    bucketed all-reduce happens once per optimizer step. Forward/backward time of every
    micro-batch adds up in the step's `forward`/`backward` phases.
    """
    ddp = isinstance(model, nn.parallel.DistributedDataParallel)
    losses = []
    for k, (xm, ym) in enumerate(zip(x.chunk(accum), y.chunk(accum), strict=True)):
        skip_sync = ddp and k < accum - 1
        with model.no_sync() if skip_sync else contextlib.nullcontext():
            with timer.phase("forward"):
                with torch.autocast(x.device.type, dtype=amp, enabled=amp is not None):
                    loss = F.cross_entropy(model(xm), ym)
            if on_backward is not None and k == accum - 1:
                on_backward()  # before the backward that all-reduces (fault hooks, heartbeat)
            with timer.phase("backward"):
                scaler.scale(loss / accum if accum > 1 else loss).backward()
        losses.append(loss.detach())
    return losses[0] if accum == 1 else torch.stack(losses).mean()


def _backward_starts(hooks: faults.FaultHooks, beat: Heartbeat, rank: int, step: int) -> None:
    hooks.before_backward(rank, step)  # the hang test hook
    beat.beat(step, "backward")


def train(cfg: TrainConfig, ctx: RunContext, run_dir: Path) -> None:
    """Train, evaluate each epoch, and (rank 0) write steps.csv and run.json."""
    start = time.perf_counter()
    hooks, attempt_no = faults.FaultHooks.from_env(), faults.attempt()  # read once, not per step
    beat = Heartbeat.of_rank(run_dir, ctx.rank, attempt=attempt_no, collectives=ctx.mode == "ddp")
    threads = _set_threads(ctx)
    use_cuda = ctx.device.type == "cuda"
    data = build_datasets(cfg.dataset, cfg.data_dir, download=cfg.download)
    global_batch, per_device = ctx.plan.global_batch, ctx.plan.per_device_batch
    assert global_batch is not None  # init_context refuses a plan that cannot run
    fail_at = faults.injected_failure_step(ctx.rank)
    # DP is one replica of the sampler (DataParallel splits the batch itself); DDP ranks take shares.
    sampler = GlobalBatchSampler(
        num_samples=len(data.train),
        global_batch=global_batch,
        rank=ctx.rank,
        replicas=ctx.world_size,
        seed=cfg.seed,
    )
    loader = train_loader(
        data.train, sampler, num_workers=cfg.num_workers, pin_memory=cfg.pin_memory
    )
    test_loader = eval_loader(
        data.test,
        rank=ctx.rank,
        world_size=ctx.world_size,
        batch_size=256,
        num_workers=cfg.num_workers,
        pin_memory=cfg.pin_memory,
    )
    torch.manual_seed(cfg.seed)  # the same initial weights in every mode and on every rank
    model = wrap_model(build_model(cfg.model, num_classes=data.num_classes), ctx, cfg)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.amp)
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=use_cuda and cfg.amp == "fp16")
    timer = StepTimer(device=ctx.device)
    memory = MemoryTracker(rank=ctx.rank, devices=list(ctx.devices))
    profiler = ProfilerSession(
        ProfileConfig(**cfg.profile_kwargs()),
        trace_dir=run_dir / "traces",
        # A restarted attempt's traces get names of their own (rank<r>_attempt<k>.<ts>...).
        worker_name=("dp" if ctx.mode == "dp" else f"rank{ctx.rank}")
        + (f"_attempt{attempt_no}" if attempt_no else ""),
        use_cuda=use_cuda,
    )
    state = LoopState()
    ckpt = run_dir / "checkpoint.pt"
    if attempt_no:  # torchrun restarted the job: continue from the last checkpoint, if any
        resume(ckpt, ctx, model, optimizer, scaler, state, attempt_no=attempt_no)
    first_step = state.step
    rows: list[dict] = []  # this rank's rows since the last checkpoint (earlier: state.rows)
    active_steps: list[int] = []  # steps the profiler recorded (profiler_overhead_pct)
    planned = cfg.epochs * len(sampler)
    planned = min(planned, cfg.max_steps) if cfg.max_steps else planned
    print(
        f"[rank{ctx.rank}] mode={ctx.mode} backend={ctx.backend} device={ctx.device} "
        f"world={ctx.world_size} threads={threads} global_batch={global_batch} per_device={per_device} "
        f"grad_accum={cfg.grad_accum_steps} "
        f"steps={planned}"
        + (f" attempt={attempt_no} resumed_from={first_step}" if attempt_no else ""),
        flush=True,
    )
    static = StaticMemory(
        rank=ctx.rank, devices=list(ctx.devices), planned_steps=max(1, planned - first_step)
    )
    bar = tqdm(
        total=planned,
        initial=first_step,
        desc=f"{ctx.mode} train",
        unit="step",
        disable=not ctx.is_main,
        file=sys.__stderr__,
    )
    memory.start()
    profiler.start(step=state.step)
    while state.epoch < cfg.epochs and state.step < planned:
        sampler.set_epoch(state.epoch, start=state.epoch_step)
        epoch_start = time.perf_counter()
        batches = iter(loader)
        while state.epoch_step < len(sampler) and state.step < planned:
            timer.start_step()
            beat.beat(state.step, "data")
            with timer.phase("data"):
                x, y = next(batches)
                x = x.to(ctx.device, non_blocking=True)
                y = y.to(ctx.device, non_blocking=True)
            if state.step == fail_at:
                faults.raise_injected_failure(ctx.rank, state.step)
            hooks.before_forward(ctx.rank, state.step)
            beat.beat(state.step, "forward")
            loss = _forward_backward(
                model,
                x,
                y,
                accum=cfg.grad_accum_steps,
                timer=timer,
                scaler=scaler,
                amp=amp_dtype,
                on_backward=partial(_backward_starts, hooks, beat, ctx.rank, state.step),
            )
            loss = hooks.poison(loss, state.step)
            beat.beat(state.step, "optimizer")
            static.after_backward(model, state.step)  # between phases; counts once
            with timer.phase("optimizer"):
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
            times = timer.end_step()
            phase = profiler.phase()  # of this step, asked before step() moves the schedule on
            if phase == "active":
                active_steps.append(state.step)
            static.after_optimizer(model, optimizer, state.step)  # once; outside step_time_s
            profiler.step()
            sample = memory.step_sample()
            if state.step == first_step:
                memory.mark_first_step()
            loss_value = float(loss.item())
            faults.check_loss(
                loss_value, rank=ctx.rank, step=state.step, stop=cfg.stop_on_nonfinite
            )
            rows.append(
                {
                    "rank": ctx.rank,
                    "epoch": state.epoch,
                    "step": state.step,
                    "warmup": int(state.step < cfg.warmup_steps),
                    "profiled": int(phase != "none"),
                    **times,
                    "samples": len(y),
                    "loss": loss_value,
                    "rss_bytes": sample["rss_bytes"],
                    "cuda_allocated_bytes": sample["cuda_allocated_bytes"],
                }
            )
            state.step += 1
            state.epoch_step += 1
            if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0:
                beat.beat(state.step, "checkpoint")
                checkpoint_now(ckpt, ctx, model, optimizer, scaler, state, rows)
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.4f}", refresh=False)
        state.epoch_times.append(time.perf_counter() - epoch_start)
        beat.beat(state.step, "eval")
        result = evaluate(
            unwrap_model(model), test_loader, ctx, epoch=state.epoch, on_batch=beat.tick
        )
        state.evals.append(result)
        print(
            f"[rank{ctx.rank}] epoch {state.epoch}: {state.epoch_step} steps, "
            f"test_loss {result['test_loss']:.4f} top1 {result['top1_pct']:.2f}% top5 {result['top5_pct']:.2f}%",
            flush=True,
        )
        state.epoch += 1
        state.epoch_step = 0
        if cfg.checkpoint:
            beat.beat(state.step, "checkpoint")
            checkpoint_now(ckpt, ctx, model, optimizer, scaler, state, rows)
    bar.close()
    profiler.stop()
    memory.stop()
    if cfg.save_final and ctx.is_main:
        save_final(run_dir / "final.pt", model)
    beat.beat(state.step, "finish")
    finish(
        cfg,
        ctx,
        run_dir,
        model=model,
        rows=state.rows + rows,  # rank 0: every rank's rows up to the checkpoint, then its own
        active_steps=active_steps,
        memory=memory,
        static=static,
        profiler=profiler,
        evals=state.evals,
        epoch_times=state.epoch_times,
        restarts=attempt_no,
        threads=threads,
        start=start,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m workloads.train",
        description="One training run (single | dp | ddp). DDP ranks are started by torchrun; "
        "use `python -m workloads.launch` to get the run folder and torchrun set up for you.",
    )
    add_config_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        cfg = config_from_namespace(ns)
    except ValueError as exc:
        parser.error(str(exc))
    if not cfg.run_id:
        if cfg.mode == "ddp":
            parser.error("--run-id is required for ddp (every rank must write the same run folder)")
        cfg.run_id = default_run_id(cfg, backend="none", world_size=1)
    env_rank = int(os.environ.get("RANK", "0"))
    run_dir = Path(cfg.runs_dir) / cfg.run_id
    with rank_log(run_dir / "logs" / f"rank{env_rank}.log"):
        try:
            ctx = init_context(cfg)
            train(cfg, ctx, run_dir)
        except BaseException as exc:  # noqa: BLE001 - every failure must leave a record for the launcher
            traceback.print_exc()
            details = faults.error_details(exc, cfg)
            write_error_record(run_dir, rank=env_rank, exc=exc, details=details)
        else:
            teardown()
            return 0
    # A failed rank leaves at once, without destroying the process group: that would wait on
    # peers blocked in a collective, torchrun would then SIGTERM this process, and the run
    # record would show -15 instead of the rank's own exit code.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
