"""Static memory per rank and device, counted exactly from the tensors (run.json
`metrics.memory_breakdown`).

Where the bytes that live across steps sit, by category, each storage counted once: tensors are
grouped by their *storage* (`untyped_storage()`, keyed by device and data pointer), so views, tied
weights and DDP's gradient-as-bucket-view gradients are not counted twice, and a storage is
assigned to the first category that reaches it in this order:

- `parameters_bytes`: the model's parameters (the unwrapped module's; DataParallel: on its first
  GPU, where they live between steps);
- `gradients_bytes`: the storages `.grad` points to right after `backward()` of the counted step;
- `optimizer_state_bytes`: every tensor in `optimizer.state` (SGD momentum, Adam moments, ...),
  counted after the optimizer step, so after the first step it exists;
- `buffers_bytes`: the module's buffers (BatchNorm running statistics and counters);
- `ddp_buckets_bytes`: DDP's flat gradient buckets that `.grad` does not share. The reducer does
  not expose its bucket tensors, so each bucket's size and parameters come from
  `reducer._get_zeros_like_grad_buckets()` (a same-shaped copy, freed at once); a bucket counts
  as shared when the gradients of all its parameters are views of one storage of exactly the
  bucket's size (what `gradient_as_bucket_view=True` does once DDP has rebuilt its buckets after
  the first iteration), otherwise its bytes are extra. By default this is about the gradients'
  size; with `--gradient-as-bucket-view` it is 0 and `gradients_bytes` is the bucket storage.
  (Should a torch version lack that private call, DDP's logged bucket sizes are used instead,
  all extra unless the model was built with gradient_as_bucket_view.)

`static_total_bytes` is their sum. The count is taken once, at the second optimizer step (the
first when the run has only one): after DDP's bucket rebuild and once optimizer state exists, and
outside the profiler's recorded steps with the default schedule.

The sharded modes are counted from the real shards (profiler.memory_sharded): under FSDP2 a
parameter, its gradient and its optimizer state are DTensors, and each is counted by its local
shard's storage, so parameters and gradients are total ÷ world plus the padding of the last
chunks (gradients are one padded flat reduce-scatter output per group) and there are no DDP
buckets. `fsdp_unsharded_peak_bytes` (not part of the static total: it lives only while blocks
are gathered) is the most bytes of gathered parameters alive at once during the counted step.
ZeRO-1's optimizer state is its inner optimizer's, i.e. the state of this rank's share of the
parameters only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from profiler.memory_sharded import GatheredPeak, is_fsdp, local, optimizer_state

__all__ = ["CATEGORIES", "StaticMemory", "storage_key"]

CATEGORIES = (
    "parameters_bytes",
    "gradients_bytes",
    "optimizer_state_bytes",
    "buffers_bytes",
    "ddp_buckets_bytes",
)


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    """(device, data pointer) of the tensor's storage: equal for views of one allocation."""
    return str(t.device), t.untyped_storage().data_ptr()


def _tensors(obj: object) -> Iterable[torch.Tensor]:
    """Tensors inside optimizer state values (tensors, or lists/dicts of them)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _tensors(v)


class StaticMemory:
    """Counts one rank's static memory by category and device; see the module docstring.

    Call `before_step(model, step)` before the step's forward (FSDP's unsharded peak is sampled
    during it), `after_backward(model, step)` between backward and the optimizer step and
    `after_optimizer(model, optimizer, step)` after it, every step; only the second step this
    process runs is counted (the first when `planned_steps` is 1).
    """

    def __init__(self, *, rank: int, devices: list[torch.device], planned_steps: int) -> None:
        if planned_steps < 1:
            raise ValueError(f"planned_steps must be >= 1, got {planned_steps}")
        self.rank = rank
        self.devices = [str(torch.device(d)) for d in devices] or ["cpu"]
        self.count_call = 1 if planned_steps >= 2 else 0  # the 2nd step this process runs
        self._calls = {"start": 0, "backward": 0, "optimizer": 0}
        self._gathered: GatheredPeak | None = None
        self.counted_at_step: int | None = None
        self._seen: set[tuple[str, int]] = set()
        self._bytes: dict[str, dict[str, int]] = {}
        self._grad_storage: dict[int, tuple[tuple[str, int], int]] = {}  # id(param) -> key, nbytes
        self._done = False

    def _add(self, category: str, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            if t is None or t.device.type == "meta":
                continue
            t = local(t)  # a DTensor's own shard
            key = storage_key(t)
            if key in self._seen:
                continue
            self._seen.add(key)
            per_device = self._bytes.setdefault(key[0], dict.fromkeys(CATEGORIES, 0))
            per_device[category] += int(t.untyped_storage().nbytes())

    def before_step(self, model: nn.Module | None, step: int) -> None:
        """Start sampling FSDP's unsharded peak (on the counted step of an FSDP model only)."""
        self._calls["start"] += 1
        if self._calls["start"] - 1 != self.count_call or self._done or not is_fsdp(model):
            return
        self._gathered = GatheredPeak()
        self._gathered.install(model)

    def after_backward(self, model: nn.Module, step: int) -> None:
        """Count parameters, gradients and buffers (on the counted step only)."""
        self._calls["backward"] += 1
        if self._gathered is not None:
            self._gathered.remove()  # the counted step's forward and backward are sampled
        if self._calls["backward"] - 1 != self.count_call or self._done:
            return
        self.counted_at_step = step
        module = _unwrap(model)
        params = list(module.parameters())
        self._add("parameters_bytes", params)
        grads = [p.grad for p in params if p.grad is not None]
        self._grad_storage = {
            id(p): (storage_key(local(p.grad)), int(local(p.grad).untyped_storage().nbytes()))
            for p in params
            if p.grad is not None
        }
        self._add("gradients_bytes", grads)
        self._add("buffers_bytes", module.buffers())

    def after_optimizer(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int
    ) -> None:
        """Count optimizer state and DDP's unshared buckets (on the counted step only)."""
        self._calls["optimizer"] += 1
        if self._calls["optimizer"] - 1 != self.count_call or self._done:
            return
        self._add("optimizer_state_bytes", _tensors(list(optimizer_state(optimizer).values())))
        if isinstance(model, nn.parallel.DistributedDataParallel):
            for device, nbytes in self._ddp_extra(model).items():
                per_device = self._bytes.setdefault(device, dict.fromkeys(CATEGORIES, 0))
                per_device["ddp_buckets_bytes"] += nbytes
        self._done = True

    def _ddp_extra(self, model: nn.parallel.DistributedDataParallel) -> dict[str, int]:
        """Bytes per device of DDP buckets whose storage no `.grad` shares."""
        extra: dict[str, int] = {}
        # A same-shaped copy of each bucket with its parameters: the reducer's only Python view
        # of its buckets. Taken after the optimizer step, when the gradients are already freed,
        # so the copy does not raise the step's memory peak.
        try:
            buckets = model.reducer._get_zeros_like_grad_buckets()
        except (AttributeError, RuntimeError):  # a private API: never let it fail a training run
            return self._ddp_extra_from_logging(model)
        for bucket in buckets:
            buf = bucket.buffer()
            nbytes = buf.numel() * buf.element_size()
            grad_storages = {self._grad_storage.get(id(p)) for p in bucket.parameters()}
            shared = (
                len(grad_storages) == 1
                and None not in grad_storages
                and next(iter(grad_storages))[1] == nbytes
            )
            if not shared:
                extra[str(buf.device)] = extra.get(str(buf.device), 0) + int(nbytes)
        del buckets
        return extra

    def _ddp_extra_from_logging(self, model: nn.parallel.DistributedDataParallel) -> dict[str, int]:
        """Fallback without the reducer's buckets: DDP's logged bucket sizes, all extra unless
        the model uses gradient-as-bucket-view."""
        if getattr(model, "gradient_as_bucket_view", False):
            return {}
        info = model._get_ddp_logging_data()
        sizes = info.get("rebuilt_bucket_sizes") or info.get("bucket_sizes") or ""
        device = str(next(model.module.parameters()).device)
        return {device: sum(int(n) for n in re.findall(r"\d+", str(sizes)))}

    def entries(self) -> list[dict]:
        """run.json `metrics.memory_breakdown` entries of this rank, one per device; [] when the
        counted step was never reached."""
        if not self._done:
            return []
        out = []
        for device in self.devices:
            counts = self._bytes.get(device, dict.fromkeys(CATEGORIES, 0))
            out.append(
                {
                    "rank": self.rank,
                    "device": device,
                    **counts,
                    "static_total_bytes": sum(counts.values()),
                    "fsdp_unsharded_peak_bytes": self._unsharded_peak(device),
                    "counted_at_step": self.counted_at_step,
                }
            )
        return out

    def _unsharded_peak(self, device: str) -> int | None:
        """FSDP's sampled unsharded peak on the rank's device; None outside FSDP (or unsampled)."""
        if self._gathered is None or device != self.devices[0]:
            return None
        return self._gathered.peak_bytes


def _unwrap(model: nn.Module) -> nn.Module:
    # DataParallel, DDP and the AMP forward wrapper all keep the real module in `.module`.
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model
