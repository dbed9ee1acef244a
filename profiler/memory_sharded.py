"""What the sharded modes hold, read from the real shards: FSDP2's parameter groups (run.json
`metrics.fsdp`), the unsharded peak while blocks are gathered, and ZeRO-1's optimizer state.

- A **group** is the parameters one `fully_shard` call owns: one all-gather before its forward
  (again before its backward when it resharded after forward) and one reduce-scatter of its
  gradients in backward. Each parameter is split along dim 0 into world-size chunks, the last
  ones padded to the first's size, so a group's all-gather output (`unsharded_bytes`) is world ×
  its padded shard (`shard_bytes`), a little above the unpadded parameters.
- The **unsharded peak** (`fsdp_unsharded_peak_bytes` of the memory breakdown): the most bytes
  of gathered (unsharded) parameters alive at once on the rank during the counted step, summed
  over every group's all-gather outputs whose storage is allocated, and the flat output of an
  all-gather still in flight (the next block's prefetch). It is sampled where it can be
  highest: at each FSDP module's forward (after its all-gather, before it reshards) and at the
  start of its backward (after its all-gather and the next block's prefetch). With
  reshard_after_forward it is about the two largest adjacent blocks; without, every block
  gathered in forward stays until its backward, i.e. about the whole model.

The FSDP internals read here (`_get_fsdp_state`, `FSDPParam`) are private torch APIs: every read
falls back to "unknown" (None, no hooks) rather than failing a training run.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from profiler.runfolder.schema import FsdpConfig, FsdpGroup, FsdpMetrics

__all__ = [
    "GatheredPeak",
    "fsdp_groups",
    "fsdp_info",
    "is_fsdp",
    "loaded_class",
    "local",
    "optimizer_state",
    "sharding_seen",
]


def loaded_class(module: str, name: str) -> type | tuple[()]:
    """`module.name` when `module` is already imported, else `()` (which `isinstance` never
    matches). A model is FSDP-sharded, a tensor a DTensor or an optimizer ZeRO's only once their
    module was imported, so the check itself imports nothing: torch.distributed.fsdp and
    .tensor cost about a second of every DDP or single rank's start-up, which never uses them."""
    loaded = sys.modules.get(module)
    return getattr(loaded, name, ()) if loaded is not None else ()


def _fsdp_module() -> type | tuple[()]:
    return loaded_class("torch.distributed.fsdp", "FSDPModule")


def is_fsdp(model: nn.Module | None) -> bool:
    """`model` (or a module inside it) is FSDP2-sharded: fully_shard was applied."""
    fsdp_module = _fsdp_module()
    return model is not None and any(isinstance(m, fsdp_module) for m in model.modules())


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own tensor: a DTensor's local shard (its storage is the padded shard), else
    `t` itself."""
    dtensor = loaded_class("torch.distributed.tensor", "DTensor")
    return t._local_tensor if isinstance(t, dtensor) else t


def _is_zero(optimizer: torch.optim.Optimizer | None) -> bool:
    return type(optimizer).__name__ == "ZeroRedundancyOptimizer" and isinstance(
        getattr(optimizer, "optim", None), torch.optim.Optimizer
    )


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's per-parameter state on this rank: ZeRO-1's is its inner optimizer's (the
    wrapper's own `state` stays empty)."""
    return optimizer.optim.state if _is_zero(optimizer) else optimizer.state


def _reshards(model: nn.Module) -> bool | None:
    """reshard_after_forward of a sharded model's blocks (the root never reshards); None when
    it has no block or torch's internals changed."""
    try:
        blocks = [g for name, g in _groups(model) if name]
        return None if not blocks else any(g.post_forward_mesh_info is not None for g in blocks)
    except AttributeError:
        return None


def sharding_seen(
    model: nn.Module | None, optimizer: torch.optim.Optimizer | None
) -> dict[str, int | FsdpConfig | None]:
    """What a --script run's model and optimizer say of the family, as a rank part's `zero` and
    `fsdp_config` (run.json config.zero and config.fsdp, the wrap rule `seen`):
    ZeroRedundancyOptimizer, fully_shard."""
    fsdp = None
    if is_fsdp(model):
        fsdp = FsdpConfig(wrap="seen", reshard_after_forward=_reshards(model))
    return {"zero": 1 if _is_zero(optimizer) else 0, "fsdp_config": fsdp}


def _groups(model: nn.Module) -> Iterator[tuple[str, object]]:
    """(qualified name, FSDPParamGroup) of every FSDP module that owns parameters."""
    for name, module in model.named_modules():
        if isinstance(module, _fsdp_module()):
            try:
                group = module._get_fsdp_state()._fsdp_param_group
            except AttributeError:
                continue
            if group is not None:
                yield name, group


def _padded_numel(fp: object) -> int:
    return int(torch.Size(fp.padded_sharded_param_size).numel())


def _gather_itemsize(fp: object) -> int:
    dtype = getattr(fp, "param_dtype", None) or fp._sharded_param_data.dtype
    return torch.empty(0, dtype=dtype).element_size()


def fsdp_groups(model: nn.Module) -> list[FsdpGroup] | None:
    """run.json `metrics.fsdp.groups`: per group its module, parameter tensors, unpadded
    elements, all-gather output bytes (world × padded shard) and padded shard bytes; None when
    `model` is not sharded or torch's internals changed."""
    try:
        out = []
        for name, group in _groups(model):
            world = int(group.mesh_info.shard_mesh_size)
            params = group.fsdp_params
            shard = sum(_padded_numel(fp) * _gather_itemsize(fp) for fp in params)
            out.append(
                FsdpGroup(
                    module=name,
                    params=len(params),
                    numel=sum(int(torch.Size(fp._orig_size).numel()) for fp in params),
                    unsharded_bytes=world * shard,
                    shard_bytes=shard,
                )
            )
        return out or None
    except (AttributeError, TypeError, RuntimeError):
        return None


def fsdp_info(model: nn.Module | None) -> FsdpMetrics | None:
    """run.json `metrics.fsdp` (None outside FSDP): the world size the groups are sharded over
    and the groups (`fsdp_groups`)."""
    if model is None or not is_fsdp(model):
        return None
    groups = fsdp_groups(model)
    if groups is None:
        return None
    world = next(g for _, g in _groups(model)).mesh_info.shard_mesh_size
    return FsdpMetrics(world_size=int(world), groups=groups)


def _gathered_tensors(group: object) -> Iterator[torch.Tensor]:
    """A group's gathered parameters, and its all-gather's flat output while one is in flight (a
    prefetch not yet copied out into the parameters)."""
    pending = getattr(group, "_all_gather_result", None)
    if pending is not None:
        yield pending.all_gather_output
    for fp in group.fsdp_params:
        yield from getattr(fp, "all_gather_outputs", ())


def _gathered_bytes(groups: list[object]) -> int:
    """Bytes of gathered parameters and in-flight all-gathers now allocated, each storage once."""
    seen: set[int] = set()
    total = 0
    for group in groups:
        for t in _gathered_tensors(group):
            storage = t.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += int(storage.nbytes())
    return total


def _tensors(obj: object) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _tensors(v)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)


class GatheredPeak:
    """Samples the unsharded peak (module docstring) over one step: `install(model)` before its
    forward, `remove()` after its backward, then read `peak_bytes` (None when never sampled)."""

    def __init__(self) -> None:
        self.peak_bytes: int | None = None
        self._handles: list = []
        self._groups: list[object] = []

    def sample(self, *_args: object) -> None:
        now = _gathered_bytes(self._groups)
        self.peak_bytes = now if self.peak_bytes is None else max(self.peak_bytes, now)

    def _on_output(self, module: nn.Module, args: tuple, output: object) -> None:
        self.sample()
        # Hooks on the output run in backward after FSDP's own (registered by its post-forward
        # hook, which ran before this one): after this block's all-gather and the prefetch.
        for t in _tensors(output):
            if t.requires_grad:
                t.register_hook(lambda grad: self.sample())

    def install(self, model: nn.Module) -> None:
        try:
            self._groups = [g for _, g in _groups(model)]
        except AttributeError:
            self._groups = []
        if not self._groups:
            return
        for module in model.modules():
            if isinstance(module, _fsdp_module()):
                # appended: run after FSDP's pre-forward all-gather; the prepended post-hook runs
                # before FSDP's post-forward reshard, the appended one after it.
                self._handles += [
                    module.register_forward_pre_hook(self.sample),
                    module.register_forward_hook(self.sample, prepend=True),
                    module.register_forward_hook(self._on_output),
                ]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
