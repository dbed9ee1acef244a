"""The training entrypoint for every mode: `python -m workloads.train` (what torchrun starts).

One loop for single, DataParallel, DDP (ZeRO-1 with --zero 1) and FSDP2: the mode only changes
the RunContext (decided once) and the wrapper (workloads.train.context.wrap_model, and the
optimizer, gradient-accumulation and evaluation helpers beside it). Each optimizer step is timed in four phases
(data, forward, backward, optimizer). At the end every rank's step rows and memory peaks are
gathered to rank 0, which writes steps.csv and run.json atomically (workloads.train.finish). Each
rank logs to `logs/rank<r>.log`; a rank that raises also writes `logs/rank<r>.error.json` (with
its `kind`, workloads.launch.faults) and exits 1 so the launcher can name it. `--checkpoint-every`
and a torchrun restart resume through workloads.train.checkpoint.

Everything else the loop does happens in callbacks (profiler.callbacks), fired at fixed points
of every step, in this order:

    run_start
    per epoch:
        per step:  step_start, [data], after_data, [forward], after_forward, [backward],
                   after_backward, [optimizer], step_end, (checkpoint every N steps)
        epoch_end, eval_batch per evaluation batch, (checkpoint with --checkpoint)
    run_end

([phase] is a timed phase; with gradient accumulation forward and backward alternate per
micro-batch and after_forward fires once, before the last micro-batch's backward.) The
callbacks, in list order: StepRecorder (phase timers, steps.csv rows), StaticMemoryCount,
ProfilerStep, MemorySampler (profiler.callbacks), SaveFinal (workloads.train.checkpoint),
FaultInjection (workloads.launch.faults), HeartbeatCallback (workloads.launch.heartbeat, which
rewrites `logs/rank<r>.heartbeat.json`), the progress bar, then any passed to `train`; they are
built in workloads.train.instruments, and docs/callbacks.md says what each does where.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from profiler.callbacks import Callback, StepState
from profiler.runfolder.errors import UserError
from workloads.config import (
    PROCESS_GROUP_MODES,
    OneLineParser,
    TrainConfig,
    add_config_arguments,
    config_from_namespace,
    default_run_id,
)
from workloads.launch import faults, flightrec
from workloads.launch.child import die_with_parent
from workloads.launch.heartbeat import Heartbeat
from workloads.launch.runlog import rank_log, write_error_record
from workloads.train.checkpoint import LoopState, checkpoint_now, resume
from workloads.train.components import Components, build_components, planned_steps
from workloads.train.context import RunContext, eval_model, init_context, sync_gradients, teardown
from workloads.train.finish import finish
from workloads.train.instruments import Instruments, build_instruments
from workloads.train.losses import LossFn, eval_record, eval_sums, output_kind

__all__ = ["evaluate", "main", "train"]


def set_threads(ctx: RunContext) -> int:
    """The plan's threads per rank: `--threads N`, else CPU ranks share the cores and GPU runs
    keep torch's default."""
    torch.set_num_threads(ctx.plan.threads_per_rank)
    return torch.get_num_threads()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    ctx: RunContext,
    *,
    loss_fn: LossFn,
    epoch: int,
    on_batch: Callable[[], None] | None = None,
) -> dict:
    """The eval entry over the whole test split: the loss, and top-1/top-5 or token top-1 and
    perplexity as the output allows (workloads.train.losses). Each rank evaluates its shard with
    the unwrapped module (no collectives per batch) and the sums are all-reduced, so every mode
    reports the same numbers."""
    model.eval()
    sums = torch.zeros(6, dtype=torch.float64, device=ctx.device)  # losses.eval_sums' layout
    kind = "other"
    for x, y in loader:
        if on_batch:  # a long eval still shows progress to the launcher's hang watchdog
            on_batch()
        x, y = x.to(ctx.device), y.to(ctx.device)
        out = model(x)
        kind = output_kind(out, y)
        sums += eval_sums(out, y, loss_fn)
    if ctx.process_group:
        dist.all_reduce(sums)
    model.train()
    return eval_record(kind, sums.tolist(), epoch=epoch)


def _eval_line(result: dict) -> str:
    """`test_loss 0.6931 top1 51.20% top5 100.00% perplexity 2.00` with what the eval has."""
    pieces = [f"test_loss {result['test_loss']:.4f}"]
    for key, label, fmt in (
        ("top1_pct", "top1", "{:.2f}%"),
        ("top5_pct", "top5", "{:.2f}%"),
        ("perplexity", "perplexity", "{:.2f}"),
    ):
        if result.get(key) is not None:
            pieces.append(f"{label} {fmt.format(result[key])}")
    return " ".join(pieces)


def _forward_backward(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    accum: int,
    phase: Callable[[str], contextlib.AbstractContextManager[None]],
    scaler: torch.amp.GradScaler,
    amp: torch.dtype | None,
    loss_fn: LossFn,
    before_sync_backward: Callable[[], None],
) -> torch.Tensor:
    """Forward and backward of one optimizer step over `accum` micro-batches; returns the loss
    over the rank's whole share (the mean of the equal-sized micro-batch means).

    Micro-batch k is the k-th contiguous chunk of this rank's share, i.e. positions
    [k*m, (k+1)*m) of it (m = share / accum), so the step still covers exactly the sampler's
    global batch. Each micro-batch loss is scaled by 1/accum so the accumulated gradient is the
    share's mean gradient; all but the last micro-batch run without gradient communication
    (context.sync_gradients: DDP's `no_sync()`, FSDP2's deferred reduce-scatter), so the
    gradients are all-reduced (reduce-scattered) once per optimizer step. Forward/backward time of every
    micro-batch adds up in the step's `forward`/`backward` phases; `before_sync_backward` runs
    once, before the last micro-batch's backward (the one that all-reduces).
    """
    losses = []
    for k, (xm, ym) in enumerate(zip(x.chunk(accum), y.chunk(accum), strict=True)):
        with sync_gradients(model, k == accum - 1):
            with phase("forward"):
                with torch.autocast(x.device.type, dtype=amp, enabled=amp is not None):
                    loss = loss_fn(model(xm), ym)
            if k == accum - 1:
                before_sync_backward()
            with phase("backward"):
                scaler.scale(loss / accum if accum > 1 else loss).backward()
        losses.append(loss.detach())
    return losses[0] if accum == 1 else torch.stack(losses).mean()


@dataclass(kw_only=True)
class _Run:
    """One rank's training: the components, the loop's progress and the callbacks it fires."""

    cfg: TrainConfig
    ctx: RunContext
    components: Components
    loop: LoopState
    state: StepState
    inst: Instruments
    checkpoint_path: Path

    def fire(self, event: str) -> None:
        self.state.epoch, self.state.step = self.loop.epoch, self.loop.step
        self.inst.callbacks.fire(event, self.state)

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self.inst.callbacks.phase(self.state, name)

    def step(self, batches: Iterator) -> None:
        """One optimizer step, with its callbacks."""
        p, device = self.components, self.ctx.device
        self.fire("step_start")
        with self.phase("data"):
            x, y = next(batches)
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
        self.state.samples = len(y)
        self.fire("after_data")
        self.state.loss = _forward_backward(
            p.model,
            x,
            y,
            accum=self.cfg.grad_accum_steps,
            phase=self.phase,
            scaler=p.scaler,
            amp=p.amp,
            loss_fn=p.loss_fn,
            before_sync_backward=partial(self.fire, "after_forward"),
        )
        self.fire("after_backward")
        with self.phase("optimizer"):
            p.scaler.step(p.optimizer)
            p.scaler.update()
            p.optimizer.zero_grad(set_to_none=True)
        self.fire("step_end")

    def checkpoint(self) -> None:
        """Collective under DDP: the loop state and every rank's rows so far (rank 0 saves)."""
        self.fire("checkpoint")
        p = self.components
        checkpoint_now(
            self.checkpoint_path,
            self.ctx,
            p.model,
            p.optimizer,
            p.scaler,
            self.loop,
            self.inst.recorder.rows,
        )

    def epoch(self, planned: int) -> None:
        """The rest of the current epoch (from the sampler's position), then its evaluation."""
        loop, cfg = self.loop, self.cfg
        self.components.sampler.set_epoch(loop.epoch, start=loop.epoch_step)
        epoch_start = time.perf_counter()
        batches = iter(self.components.loader)
        while loop.epoch_step < len(self.components.sampler) and loop.step < planned:
            self.step(batches)
            loop.step += 1
            loop.epoch_step += 1
            if cfg.checkpoint_every and loop.step % cfg.checkpoint_every == 0:
                self.checkpoint()
        loop.epoch_times.append(time.perf_counter() - epoch_start)
        self.fire("epoch_end")
        done = f"[rank{self.ctx.rank}] epoch {loop.epoch}: {loop.epoch_step} steps"
        if (
            self.components.test_loader is None
        ):  # no test split: nothing to evaluate (run.json says so)
            print(f"{done}, no eval (the dataset has no test split)", flush=True)
        else:
            result = evaluate(
                eval_model(self.components.model, self.ctx),
                self.components.test_loader,
                self.ctx,
                loss_fn=self.components.loss_fn,
                epoch=loop.epoch,
                on_batch=partial(self.fire, "eval_batch"),
            )
            loop.evals.append(result)
            print(f"{done}, {_eval_line(result)}", flush=True)
        loop.epoch += 1
        loop.epoch_step = 0
        if cfg.checkpoint:
            self.checkpoint()


def _announce(
    cfg: TrainConfig,
    ctx: RunContext,
    *,
    threads: int,
    planned: int,
    loop: LoopState,
    attempt_no: int,
) -> None:
    print(
        f"[rank{ctx.rank}] mode={ctx.mode} backend={ctx.backend} device={ctx.device} "
        f"world={ctx.world_size} threads={threads} global_batch={ctx.plan.global_batch} "
        f"per_device={ctx.plan.per_device_batch} grad_accum={cfg.grad_accum_steps} "
        f"steps={planned}"
        + (f" attempt={attempt_no} resumed_from={loop.step}" if attempt_no else ""),
        flush=True,
    )


def train(
    cfg: TrainConfig, ctx: RunContext, run_dir: Path, *, callbacks: Sequence[Callback] = ()
) -> None:
    """Train, evaluate each epoch, and (rank 0) write steps.csv and run.json. `callbacks` run
    after the loop's own, at the points of the module docstring."""
    start = time.perf_counter()
    attempt_no = faults.attempt()  # read once, not per step
    # The first beat is on disk before the data and model are built (the launcher's watchdog).
    beat = Heartbeat.of_rank(run_dir, ctx.rank, attempt=attempt_no, collectives=ctx.process_group)
    threads = set_threads(ctx)
    components = build_components(cfg, ctx)
    loop = LoopState()
    ckpt = run_dir / "checkpoint.pt"
    if attempt_no:  # torchrun restarted the job: continue from the last checkpoint, if any
        resume(
            ckpt,
            ctx,
            components.model,
            components.optimizer,
            components.scaler,
            loop,
            attempt_no=attempt_no,
        )
    planned = planned_steps(cfg, components)
    _announce(cfg, ctx, threads=threads, planned=planned, loop=loop, attempt_no=attempt_no)
    inst = build_instruments(
        cfg, ctx, run_dir, beat, planned=planned, first_step=loop.step, extra=callbacks
    )
    run = _Run(
        cfg=cfg,
        ctx=ctx,
        components=components,
        loop=loop,
        state=StepState(
            rank=ctx.rank,
            model=components.model,
            optimizer=components.optimizer,
            first_step=loop.step,
        ),
        inst=inst,
        checkpoint_path=ckpt,
    )
    run.fire("run_start")
    while loop.epoch < cfg.epochs and loop.step < planned:
        run.epoch(planned)
    run.fire("run_end")
    finish(
        cfg,
        ctx,
        run_dir,
        model=components.model,
        rows=loop.rows
        + inst.recorder.rows,  # rank 0: every rank's rows to the checkpoint, then its own
        inst=inst,
        evals=loop.evals,
        eval_note=None if components.test_loader else f"--dataset {cfg.dataset} has no test split",
        workload=components.facts,
        epoch_times=loop.epoch_times,
        restarts=attempt_no,
        threads=threads,
        start=start,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m workloads.train",
        description="One training run (single | dp | ddp | fsdp). DDP and FSDP ranks are started "
        "by torchrun; "
        "use `python -m workloads.launch` to get the run folder and torchrun set up for you.",
    )
    add_config_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a process of its own (a rank): it ends with whoever started it
        die_with_parent()
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        cfg = config_from_namespace(ns)
    except ValueError as exc:
        parser.error(str(exc))
    if not cfg.run_id:
        if cfg.mode in PROCESS_GROUP_MODES:
            parser.error(
                f"--run-id is required for {cfg.mode} (every rank must write the same run folder)"
            )
        cfg.run_id = default_run_id(cfg, backend="none", world_size=1)
    env_rank = int(os.environ.get("RANK", "0"))
    run_dir = Path(cfg.runs_dir) / cfg.run_id
    with rank_log(run_dir / "logs" / f"rank{env_rank}.log"):
        if cfg.mode in PROCESS_GROUP_MODES:  # workloads.launch.flightrec: dumps on request/failure
            flightrec.install(run_dir, rank=env_rank, run_id=cfg.run_id, attempt=faults.attempt())
        try:
            ctx = init_context(cfg)
            train(cfg, ctx, run_dir)
        except BaseException as exc:  # noqa: BLE001 - every failure must leave a record for the launcher
            if isinstance(exc, UserError):  # a full disk, a bad dataset item: its one line
                print(f"[rank{env_rank}] error: {exc}", file=sys.stderr, flush=True)
            else:
                traceback.print_exc()
            details = faults.error_details(exc, cfg)
            write_error_record(run_dir, rank=env_rank, exc=exc, details=details)
            flightrec.dump_on_failure(details["message"][:300])
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
