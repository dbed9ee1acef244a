"""The workload a config names: its datasets, model and loss, built the same way by the launcher
(once, to check every spec before any run folder exists) and by every training process.

`check_workload` is the launcher's planning step: it imports and calls each factory, checks what
they return, runs the model once on two training samples (on CPU, without gradients) and the
loss on that output, and describes the workload for run.json. Each misuse is one SpecError line
(exit code 2). A forward that fails is left to the run itself, which then fails with
`error.kind: crash` and the model's message, exactly as it would at any later step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import default_collate

from workloads.config import TrainConfig
from workloads.spec import SpecError
from workloads.train.data import Datasets, build_datasets, dataset_item
from workloads.train.factory import exit_call, last_line
from workloads.train.losses import LossFn, build_loss, check_loss
from workloads.train.models import build_model
from workloads.train.sharding import wrap_targets

__all__ = [
    "WorkloadFacts",
    "build_data",
    "build_network",
    "check_workload",
    "describe",
    "sample_batch",
]


def build_data(cfg: TrainConfig) -> Datasets:
    """The datasets of `cfg`, built after seeding torch with the run's seed, so a user factory
    that draws random numbers makes the same data on every rank and in every mode."""
    torch.manual_seed(cfg.seed)
    return build_datasets(
        cfg.dataset_spec(),
        cfg.data_dir,
        download=cfg.download,
        dataset_args=cfg.dataset_kwargs(),
    )


def sample_batch(data: Datasets, n: int = 2, *, spec: str = "") -> tuple[Any, Any]:
    """The first `n` training samples collated into one (input, target) batch; a dataset whose
    items raise or cannot be batched together is one SpecError line naming `spec`."""
    items = [dataset_item(spec, "train", data.train, i) for i in range(min(n, len(data.train)))]
    try:
        return default_collate(items)
    except Exception as exc:  # noqa: BLE001 - items of different shapes or types
        raise SpecError(
            f"--dataset {spec}: train[0] and train[1] cannot be batched together "
            f"({last_line(exc)}); make every item the same shape and type (or collate them "
            "yourself into fixed-size tensors)"
        ) from None


def _sample_shape(x: Any) -> tuple[int, ...] | None:
    return tuple(x.shape[1:]) if isinstance(x, torch.Tensor) else None


def build_network(cfg: TrainConfig, data: Datasets) -> nn.Module:
    """A fresh model of `cfg` for `data` (seeded with the run's seed: the same initial weights in
    every mode and on every rank)."""
    x, _ = sample_batch(data, spec=cfg.dataset)
    torch.manual_seed(cfg.seed)
    return build_model(
        cfg.model_spec(),
        num_classes=data.num_classes,
        input_shape=_sample_shape(x),
        model_args=cfg.model_kwargs(),
    )


def _tensor_info(value: Any) -> tuple[tuple[int, ...] | None, str]:
    if not isinstance(value, torch.Tensor):  # e.g. a dict of tensors: no one shape to record
        return None, type(value).__name__
    return tuple(value.shape[1:]), str(value.dtype).removeprefix("torch.")


@dataclass(frozen=True, kw_only=True)
class WorkloadFacts:
    """What run.json records about the model and one batch (see `record`)."""

    parameters: int
    trainable_parameters: int
    num_classes: int | None
    has_test_split: bool
    input_sample_shape: tuple[int, ...] | None
    input_dtype: str
    target_sample_shape: tuple[int, ...] | None
    target_dtype: str
    train_samples: int
    """len() of the training split (what the launcher checks the global batch against)."""
    test_samples: int | None
    """len() of the test split (None: no test split); run.json eval.split_samples."""

    def record(self, micro_batch: int | None) -> dict:
        """run.json `config.model_facts`: the parameter count (tied weights once), and the shape and
        dtype of one micro-batch's input and target as the model sees them on one device (null
        shapes for non-tensor values or an unknown batch)."""

        def batch(shape: tuple[int, ...] | None) -> list[int] | None:
            return None if shape is None or micro_batch is None else [micro_batch, *shape]

        return {
            "parameters": self.parameters,
            "trainable_parameters": self.trainable_parameters,
            "num_classes": self.num_classes,
            "has_test_split": self.has_test_split,
            "input_shape": batch(self.input_sample_shape),
            "input_dtype": self.input_dtype,
            "target_shape": batch(self.target_sample_shape),
            "target_dtype": self.target_dtype,
        }


def describe(model: nn.Module, data: Datasets) -> WorkloadFacts:
    """The facts of `model` on `data` (parameters counted once, as model.parameters() does)."""
    x, y = sample_batch(data)
    input_shape, input_dtype = _tensor_info(x)
    target_shape, target_dtype = _tensor_info(y)
    return WorkloadFacts(
        parameters=sum(p.numel() for p in model.parameters()),
        trainable_parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
        num_classes=data.num_classes,
        has_test_split=data.test is not None,
        input_sample_shape=input_shape,
        input_dtype=input_dtype,
        target_sample_shape=target_shape,
        target_dtype=target_dtype,
        train_samples=len(data.train),
        test_samples=None if data.test is None else len(data.test),
    )


def check_workload(cfg: TrainConfig) -> WorkloadFacts:
    """Build and check every part of `cfg`'s workload (module docstring), for --mode fsdp also
    that --fsdp-wrap's classes are in the model; return `describe`."""
    data = build_data(cfg)
    model = build_network(cfg, data)
    if cfg.mode == "fsdp":
        wrap_targets(model, cfg)  # one SpecError line for a class the model does not contain
    loss_fn: LossFn = build_loss(cfg.loss_spec())
    x, y = sample_batch(data, spec=cfg.dataset)
    model.eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two samples: extra threads only spin on a busy machine
    try:
        with torch.no_grad():
            output = model(x)
    except SystemExit as exc:  # not an error of one step: the launcher would just vanish
        raise SpecError(
            f"--model {cfg.model}: your model's forward called {exit_call(exc)} on a sample "
            "batch; a forward must return its output, not exit"
        ) from None
    except Exception:  # noqa: BLE001 - the run reports it (error.kind crash), as at any step
        pass
    else:
        check_loss(cfg.loss_spec(), loss_fn, output, y)
    finally:
        torch.set_num_threads(threads)
    return describe(model, data)
