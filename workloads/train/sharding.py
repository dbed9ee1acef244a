"""The sharded members of the data-parallel family: FSDP2 (`--mode fsdp`) and ZeRO-1 (`--zero 1`
under DDP). Only workloads.train.context calls this module: it stays the one place that knows the
wrappers, and the loop never branches on the mode.

- **FSDP2**: `torch.distributed.fsdp.fully_shard` on each block of the wrap rule, then on the
  root. The default rule takes each element of the model's top-level `nn.ModuleList` /
  `nn.Sequential` containers (the model itself when it is one) that has parameters: the MLP's
  Linears, gpt's transformer blocks. `--fsdp-wrap MODULE:CLASS[,...]` names the classes instead
  (every module of those classes below the root). `--fsdp-reshard-after-forward` chooses whether
  a block's gathered parameters are freed after its forward (ZeRO-3-like: all-gathered again in
  backward) or kept until its backward (ZeRO-2-like).
- **ZeRO-1**: `torch.distributed.optim.ZeroRedundancyOptimizer` around the same SGD under DDP:
  each rank keeps the optimizer state of its share of the parameters and broadcasts the updated
  share after its step.

Evaluation, checkpoints and `final.pt` see full (unsharded) state: a sharded model's full state
dict is a collective (every rank calls it; `torch.distributed.checkpoint.state_dict`), and the
evaluation runs on a plain replica of the model built from it (the same architecture, copied on
the meta device before sharding, so it costs nothing until an evaluation fills it), so each rank
evaluates its share of the test split with no collective per batch, exactly as under DDP.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import os
import sys
import weakref
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from profiler.memory_sharded import loaded_class
from workloads.config import TrainConfig
from workloads.spec import SpecError
from workloads.train.factory import last_line

__all__ = [
    "DEFAULT_RULE",
    "eval_replica",
    "full_model_state",
    "full_optimizer_state",
    "gradient_sync",
    "is_fsdp",
    "is_zero",
    "load_model_state",
    "load_optimizer_state",
    "shard_model",
    "sgd",
    "wrap_targets",
]

DEFAULT_RULE = "default"
"""run.json `config.fsdp.wrap` of the default rule (top-level ModuleList/Sequential elements)."""

# The plain architecture of each sharded model, on the meta device (see the module docstring).
_TEMPLATES: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()
_CONTAINERS = (nn.ModuleList, nn.Sequential)


# torch.distributed.fsdp, .optim and .checkpoint are imported where a sharded member uses them,
# not here: they cost about a second of every rank's start-up (profiler.memory_sharded's
# loaded_class says why the isinstance checks need no import).


def is_fsdp(model: nn.Module) -> bool:
    """The model is FSDP2-sharded (fully_shard was applied to it)."""
    return isinstance(model, loaded_class("torch.distributed.fsdp", "FSDPModule"))


def is_zero(optimizer: torch.optim.Optimizer) -> bool:
    """The optimizer is ZeRO-1's (ZeroRedundancyOptimizer)."""
    return isinstance(optimizer, loaded_class("torch.distributed.optim", "ZeroRedundancyOptimizer"))


def _has_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _default_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Each element with parameters of the top-level containers (module docstring)."""
    containers = [("", model)] if isinstance(model, _CONTAINERS) else []
    containers += [(n, c) for n, c in model.named_children() if isinstance(c, _CONTAINERS)]
    return [
        (f"{prefix}.{name}" if prefix else name, child)
        for prefix, container in containers
        for name, child in container.named_children()
        if _has_parameters(child)
    ]


def _import_class(module_name: str, name: str) -> type:
    """The class `module_name:name` names, imported now (one SpecError line otherwise)."""
    text = f"{module_name}:{name}"
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:  # as workloads.train.factory does
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any error in the user's module is a user error
        raise SpecError(
            f"--fsdp-wrap {text}: module {module_name} does not import ({last_line(exc)}); it "
            "must import from the folder you run in or from PYTHONPATH"
        ) from exc
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise SpecError(f"--fsdp-wrap {text}: {module_name} has no nn.Module class {name}")
    return cls


def wrap_targets(model: nn.Module, cfg: TrainConfig) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of each block fully_shard wraps before the root, descendants
    before their ancestors. Raises SpecError (one line) when --fsdp-wrap names a class the model
    does not contain."""
    specs = cfg.fsdp_classes()
    classes = [_import_class(m, c) for m, c in specs]
    if not classes:
        return _default_blocks(model)
    named = [(n, m) for n, m in model.named_modules() if n]  # the root is wrapped last anyway
    for (module_name, name), cls in zip(specs, classes, strict=True):
        if not any(isinstance(m, cls) for _, m in named):
            present = sorted({type(m).__name__ for _, m in named})
            raise SpecError(
                f"--fsdp-wrap {module_name}:{name}: the model "
                f"({type(model).__name__}) contains no {cls.__name__}; its classes: "
                f"{', '.join(present[:20]) or 'none (no submodules)'}"
            )
    picked = [(n, m) for n, m in named if isinstance(m, tuple(classes)) and _has_parameters(m)]
    return sorted(picked, key=lambda nm: -nm[0].count("."))  # stable: deepest first


def _meta_template(model: nn.Module) -> nn.Module:
    """A copy of `model`'s architecture whose parameters and buffers are on the meta device
    (ties kept: one memo entry per tensor)."""
    memo: dict[int, object] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(model, memo)


def shard_model(model: nn.Module, cfg: TrainConfig) -> tuple[nn.Module, list[str]]:
    """fully_shard each wrap-rule block, then the root (`model`, already on its device); returns
    the sharded model and the names wrapped (root last, as "")."""
    from torch.distributed.fsdp import fully_shard

    targets = wrap_targets(model, cfg)
    template = _meta_template(model)
    reshard = cfg.reshard_after_forward
    for _, block in targets:
        fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    _TEMPLATES[model] = template
    return model, [name for name, _ in targets] + [""]


def sgd(params, cfg: TrainConfig, *, zero: bool) -> torch.optim.Optimizer:
    """The run's SGD over `params`; with `zero`, wrapped in ZeroRedundancyOptimizer (ZeRO-1)."""
    kw = {"lr": cfg.lr, "momentum": cfg.momentum, "weight_decay": cfg.weight_decay}
    if zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, **kw)
    return torch.optim.SGD(params, **kw)


def _full_options(*, rank0_only: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # rank0_only: the full tensors land on rank 0's CPU (checkpoints); else on every rank.
    return StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)


def full_model_state(model: nn.Module, *, rank0_only: bool = True) -> dict:
    """Collective: the sharded model's full state dict (plain tensors; {} off rank 0 with
    `rank0_only`). Buffers are rank 0's, broadcast, as a checkpoint holds them."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_full_options(rank0_only=rank0_only))
    if not rank0_only:
        for name, _ in model.named_buffers():
            if name in state:  # a copy: the rank's own buffer keeps training as it was
                state[name] = state[name].clone()
                dist.broadcast(state[name], src=0)
    return state


def load_model_state(model: nn.Module, state: dict) -> None:
    """Load a full state dict (a checkpoint's) into the sharded model, every rank."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, state, options=_full_options(rank0_only=False))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Collective: the optimizer's full state dict on rank 0 ({} elsewhere): ZeRO-1's shares
    consolidated to rank 0, FSDP's sharded state gathered."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if is_zero(optimizer):
        optimizer.consolidate_state_dict(to=0)
        return optimizer.state_dict() if dist.get_rank() == 0 else {}
    return get_optimizer_state_dict(model, optimizer, options=_full_options(rank0_only=True))


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a full optimizer state dict (a checkpoint's) on every rank."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    if is_zero(optimizer) or not is_fsdp(model):
        optimizer.load_state_dict(state)
        return
    opts = _full_options(rank0_only=False)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=opts)


def eval_replica(model: nn.Module, device: torch.device) -> nn.Module:
    """Collective: a plain module with the sharded model's full weights (rank 0's buffers), for
    an evaluation without collectives (the module docstring)."""
    state = full_model_state(model, rank0_only=False)
    replica = copy.deepcopy(_TEMPLATES[model]).to_empty(device=device)
    replica.load_state_dict(state)
    replica.train(model.training)
    return replica


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """FSDP2: reduce-scatter the gradients in this backward only when `enabled` (gradient
    accumulation: the last micro-batch's backward syncs, the others accumulate unsharded)."""
    if enabled or not is_fsdp(model):
        yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
