"""RunRecorder: the standard run folder from any training loop, with explicit marks.

    with RunRecorder(runs_dir="runs", model=model) as rec:
        for x, y in loader:
            with rec.step(samples=len(x)):
                with rec.phase("data"): ...
                with rec.phase("forward"): ...
                with rec.phase("backward"): ...
                with rec.phase("optimizer"): ...

It drives the same instruments as dpscope's own loop (`recording`: StepRecorder, the one writer
of steps.csv rows, StaticMemoryCount, ProfilerStep, MemorySampler; profiler.callbacks), decides
the rank, world size and backend from the process group if one exists (at the first step, so a
script may join one after building the recorder) and, at exit, writes this rank's part
(profiler.runfolder.parts). With `assemble=True` (the default) rank 0 then waits for every rank's part and
writes steps.csv and run.json; the `--script` launcher passes False and assembles itself.

The zero-code bootstrap (profiler.autohooks) drives a RunRecorder from torch's global hooks
through `begin_step` / `open_phase` / `end_step`; `step` and `phase` are built on the same calls.

The contract, each breach one clear error: the run id is a folder name (profiler.runfolder's
rule, also for DPSCOPE_RUN_ID) and, for the recorder that assembles, a folder no other run holds
(claimed at construction, so two recorders never share one); one open recorder per process
(torch.profiler allows one session: a second recorder, or one inside dpscope's own loop, is
refused instead of crashing Kineto); `samples` a positive integer; no step inside a step and
none after `close()`. A recorder never closed is closed at interpreter exit (atexit), writing
what it has.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from profiler.callbacks import Callbacks, StepState
from profiler.environment import collect_env
from profiler.memory_sharded import is_fsdp, sharding_seen
from profiler.modelinfo import model_metrics, model_summary
from profiler.recorderrules import (
    AT_EXIT_WARNING,
    RUN_ID_FLAG,
    RecorderError,
    check_samples,
    claim_process,
    release_process,
    resolve_run_id,
)
from profiler.recording import Recording, recording
from profiler.runfolder.layout import create_run_folder, utc_now
from profiler.runfolder.parts import assemble, wait_for_parts, write_part
from profiler.runfolder.schema import PROCESS_GROUP_MODES
from profiler.session import ProfileConfig

__all__ = ["OWN_PROFILER_WARNING", "Recording", "RecorderError", "RunRecorder", "recording"]

OWN_PROFILER_WARNING = (
    "the script runs its own torch.profiler: dpscope recorded step timings and memory only, "
    "no traces of its own (the script's traces are where it writes them)"
)
PARTS_TIMEOUT_S = 120.0
"""How long rank 0 of an in-process recorder waits for the other ranks' parts."""


def _devices(model: nn.Module | None, seen: torch.device | None) -> list[torch.device]:
    """Where the rank computes: DataParallel's GPUs, else the model's first parameter's device,
    else the device of the first input tensor seen, else the CPU."""
    if isinstance(model, nn.DataParallel):
        return [torch.device("cuda", i) for i in model.device_ids]
    if model is not None:
        for p in model.parameters():
            return [p.device]
    return [seen or torch.device("cpu")]


class RunRecorder:
    """Records one rank's steps into the run folder `runs_dir/run_id` (see the module docstring).

    `run_id` defaults to `recorder-<UTC time>`; under DDP every rank must get the same one (the
    launcher's RUN_ID, or pass it). `samples` of a step defaults to the leading dimension of the
    model's first input tensor, summed over the step's forwards (with `model` given).
    """

    def __init__(
        self,
        runs_dir: str | os.PathLike[str] = "runs",
        run_id: str | None = None,
        *,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        profile: ProfileConfig | None = None,
        warmup_steps: int = 2,
        workload: str | None = None,
        assemble: bool = True,
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0; got {warmup_steps}")
        run_id = resolve_run_id(run_id)
        self.run_dir = Path(runs_dir) / run_id
        self.run_id = run_id
        claim_process(self)
        if assemble and int(os.environ.get("RANK", "0")) == 0:  # the one writer of run.json
            try:
                create_run_folder(runs_dir, run_id, flag=RUN_ID_FLAG, writer="recorder")
            except BaseException:
                release_process(self)
                raise
        self.profile = profile or ProfileConfig()
        self.warmup_steps = warmup_steps
        self.workload = workload
        self.assemble = assemble
        self.state = StepState(model=model, optimizer=optimizer)
        self.rec: Recording | None = None
        self.callbacks = Callbacks([])
        self.mode: str | None = None  # set by whoever saw a DP/DDP wrapper (autohooks)
        self.warnings: list[str] = []
        self.input_device: torch.device | None = None
        self.samples = 0  # this step's samples counted from forward inputs
        self.micro = 0  # this step's forwards (micro-batches)
        self.micro_batches: list[int] = []
        self.in_step = False
        self._phase: tuple[str, ExitStack] | None = None
        self._fired: set[str] = set()
        self._world = (0, 1, "none", False)
        self._start = time.perf_counter()
        self._created_at = utc_now()
        self._closed = False
        self._hooks = []
        atexit.register(self._close_at_exit)
        if model is not None:
            self._hooks.append(model.register_forward_pre_hook(self._count_samples))
        if optimizer is None:  # the static breakdown needs it: the first one that steps
            self._hooks.append(register_optimizer_step_pre_hook(self._learn_optimizer))

    # -- what the run is -----------------------------------------------------------------------
    def _count_samples(self, module: nn.Module, args: tuple) -> None:
        if self.in_step and torch.is_grad_enabled():
            self.add_forward(first_tensor(args))

    def _learn_optimizer(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self.state.optimizer is None:
            self.state.optimizer = optimizer

    def add_forward(self, tensor: torch.Tensor | None) -> None:
        """One training forward of this step, with its first input tensor (samples = its
        leading dimension)."""
        self.micro += 1
        if tensor is not None:
            self.input_device = self.input_device or tensor.device
            self.samples += int(tensor.shape[0]) if tensor.dim() else 1

    def _context(self) -> tuple[int, int, str, bool]:
        """(rank, world size, backend, process group seen), from the process group while it
        exists, else torchrun's RANK; remembered, so a destroyed group keeps its answer."""
        if dist.is_available() and dist.is_initialized():
            self._world = (dist.get_rank(), dist.get_world_size(), dist.get_backend(), True)
        elif not self._world[3]:
            self._world = (int(os.environ.get("RANK", "0")), 1, "none", False)
        return self._world

    def _begin(self) -> None:
        """At the first step: the rank, devices and instruments; the profiler starts."""
        rank = self._context()[0]
        profile = self.profile
        if profile.enabled and torch._C._autograd._profiler_enabled():
            self.profiler_taken()
            profile = replace(profile, enabled=False)
        self.rec = recording(
            rank=rank,
            devices=_devices(self.state.model, self.input_device),
            profile=profile,
            trace_dir=self.run_dir / "traces",
            worker_name=f"rank{rank}",
            warmup_steps=self.warmup_steps,
            planned_steps=2,
        )
        self.callbacks = Callbacks(self.rec.callbacks())
        self.state.rank = rank
        self.callbacks.fire("run_start", self.state)

    def profiler_taken(self) -> None:
        """The script runs its own torch.profiler: stop dpscope's and say so in `warnings`."""
        if self.rec is not None:
            self.rec.profiler.session.stop()
            self.rec.profiler.session.cfg = replace(self.profile, enabled=False)
        if OWN_PROFILER_WARNING not in self.warnings:
            self.warnings.append(OWN_PROFILER_WARNING)

    # -- the step, from hooks or from `step` ---------------------------------------------------
    def begin_step(self) -> None:
        """A step starts (its time counts from here)."""
        if self._closed:
            raise RecorderError(
                f"a step after close() of the recorder for {self.run_dir}: record every step "
                "before closing it (a closed recorder has written its part)"
            )
        if self.rec is None:
            self._begin()
        self.state.step = len(self.micro_batches)
        self.samples = self.micro = 0
        self._fired = set()
        self.in_step = True
        self.callbacks.fire("step_start", self.state)

    def open_phase(self, name: str) -> None:
        """Close the open phase (if any) and time `name` from here."""
        self.close_phase()
        if name == "backward":
            self._fire_once("after_forward")
        elif name == "optimizer":
            self._fire_once("after_backward")
        stack = ExitStack()
        stack.enter_context(self.callbacks.phase(self.state, name))
        self._phase = (name, stack)

    def close_phase(self) -> None:
        if self._phase is not None:
            self._phase[1].close()
            self._phase = None

    def _fire_once(self, event: str) -> None:
        if event not in self._fired:
            self._fired.add(event)
            self.callbacks.fire(event, self.state)

    def end_step(self, samples: int | None = None) -> None:
        """The step's optimizer step is done: close it and append its row."""
        self.close_phase()
        self._fire_once("after_backward")
        self.state.samples = self.samples if samples is None else check_samples(samples)
        self.micro_batches.append(self.micro)
        self.in_step = False
        self.callbacks.fire("step_end", self.state)

    def discard_step(self) -> None:
        """A step that never reached its optimizer step (the run ended inside it)."""
        self.close_phase()
        self.in_step = False

    @contextmanager
    def step(self, samples: int | None = None) -> Iterator[None]:
        """One optimizer step; `samples` this rank's samples in it (see the class docstring)."""
        if self.in_step:
            raise RecorderError(
                f"rec.step() inside rec.step() (step {self.state.step} is still open): steps do "
                "not nest; end one `with rec.step():` block before starting the next"
            )
        if samples is not None:
            check_samples(samples)  # before the step starts: a bad value leaves no open step
        self.begin_step()
        try:
            yield
        except BaseException:
            self.discard_step()
            raise
        self.end_step(samples)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as `name`: data, forward, backward or optimizer."""
        if not self.in_step:
            raise ValueError(
                f"rec.phase({name!r}) outside a step: put it inside `with rec.step():`"
            )
        self.open_phase(name)
        try:
            yield
        finally:
            self.close_phase()

    # -- the end -------------------------------------------------------------------------------
    def _close_at_exit(self) -> None:
        if AT_EXIT_WARNING not in self.warnings:
            self.warnings.append(AT_EXIT_WARNING)
        self.close()

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        error = None if exc is None else {"message": f"{type(exc).__name__}: {exc}", "exit_code": 1}
        self.close(error=error)

    def _mode(self, world: int, pg: bool) -> str:
        if self.mode:
            return self.mode
        model = self.state.model
        if is_fsdp(model):  # fully_shard seen on the model: FSDP2, whatever the world size
            return "fsdp"
        if isinstance(model, nn.parallel.DistributedDataParallel) or (pg and world > 1):
            return "ddp"
        return "dp" if isinstance(model, nn.DataParallel) else "single"

    def part(self) -> dict:
        """This rank's part (profiler.runfolder.parts)."""
        rank, world, backend, pg = self._context()
        rec, model = self.rec, self.state.model
        mode = self._mode(world, pg)
        devices = _devices(model, self.input_device)
        summary = (
            model_summary(model) if model is not None else {"model": None, "param_count": None}
        )
        return {
            "rank": rank,
            "world_size": len(devices) if mode == "dp" else world,
            "env_world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "mode": mode,
            "backend": backend,
            "pg_seen": pg,
            "devices": [str(d) for d in devices],
            **summary,
            "workload": self.workload,
            "rows": rec.recorder.rows if rec else [],
            "micro_batches": self.micro_batches,
            "active_steps": rec.profiler.active_steps if rec else [],
            "memory": rec.memory.tracker.summary() if rec else [],
            "memory_after_first_step": rec.memory.tracker.summary_after_first_step() if rec else [],
            "memory_breakdown": rec.static.static.entries() if rec else [],
            "traces": [
                p.relative_to(self.run_dir).as_posix() for p in rec.profiler.session.trace_files()
            ]
            if rec
            else [],
            "warnings": self.warnings,
            **sharding_seen(model, self.state.optimizer),
            "wall_time_s": time.perf_counter() - self._start,
            "env": collect_env(threads_per_rank=torch.get_num_threads())
            | {"host_load": rec.host.result if rec else None},
            **(model_metrics(model) if model is not None else {}),
        }

    def close(self, *, error: dict | None = None) -> dict:
        """Stop the instruments and write this rank's part (and, with `assemble`, rank 0 the run
        folder once every rank's part is there); return the part. Idempotent."""
        if self._closed:
            return {}
        self._closed = True
        atexit.unregister(self._close_at_exit)
        release_process(self)
        for h in self._hooks:
            h.remove()
        if self.in_step:
            self.discard_step()
        if self.rec is not None:
            self.callbacks.fire("run_end", self.state)
        part = self.part()
        write_part(self.run_dir, part)
        if self.assemble and part["rank"] == 0:
            n = part["world_size"] if part["mode"] in PROCESS_GROUP_MODES else 1
            assemble(
                self.run_dir,
                wait_for_parts(self.run_dir, n, timeout_s=PARTS_TIMEOUT_S),
                run_id=self.run_id,
                status="ok" if error is None else "failed",
                error=error,
                profile=self.profile.to_dict(),
                warmup_steps=self.warmup_steps,
                created_at=self._created_at,
                wall_time_s=time.perf_counter() - self._start,
            )
        return part


def first_tensor(obj: object) -> torch.Tensor | None:
    """The first tensor in `obj`, searching tuples, lists and dicts (in their order)."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, list | tuple):
        for item in obj:
            if (found := first_tensor(item)) is not None:
                return found
    return None
