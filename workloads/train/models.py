"""`--model`: the built-in models (a registry), any torchvision classification model, or a factory
from the user's code, built the same way in every mode (after seeding, so every rank starts from
the same weights).

Built-ins take the dataset's number of classes and its input shape (any C x H x W for the image
models, token ids for `gpt`). The MLP and `gpt` have no BatchNorm on purpose: with no per-replica
batch statistics, single-device and DDP training are mathematically identical, which the
equivalence tests rely on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from torch import nn

from workloads.spec import BUILTIN_MODELS, Spec, SpecError, parse_spec
from workloads.train.factory import call_factory, load_function
from workloads.train.gpt import gpt

__all__ = ["INPUT_SHAPE", "MODELS", "build_model"]

# The image shape of the built-in image datasets (and the default of the built-in image models).
INPUT_SHAPE = (3, 32, 32)


def _cifar_resnet(depth: int, *, num_classes: int, input_shape=INPUT_SHAPE) -> nn.Module:
    from torchvision.models import resnet18, resnet50

    model = (resnet18 if depth == 18 else resnet50)(num_classes=num_classes)
    # The ImageNet stem (7x7 stride-2 conv + maxpool) would shrink 32x32 to 8x8 before the first
    # block; the usual CIFAR variant uses a 3x3 stride-1 conv and no maxpool.
    model.conv1 = nn.Conv2d(input_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def _conv_bn_relu(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True)]


def _small_cnn(*, num_classes: int, input_shape=INPUT_SHAPE) -> nn.Module:
    return nn.Sequential(
        *_conv_bn_relu(input_shape[0], 32),
        nn.MaxPool2d(2),  # 32 x H/2 x W/2
        *_conv_bn_relu(32, 64),
        nn.MaxPool2d(2),  # 64 x H/4 x W/4
        *_conv_bn_relu(64, 128),
        nn.AdaptiveAvgPool2d(1),  # 128x1x1
        nn.Flatten(),
        nn.Linear(128, num_classes),
    )


def _mlp(*, num_classes: int, input_shape=INPUT_SHAPE, hidden: int = 256) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),  # (N, prod(input_shape))
        nn.Linear(math.prod(input_shape), hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


MODELS: dict[str, Callable[..., nn.Module]] = {
    "resnet18": partial(_cifar_resnet, 18),
    "resnet50": partial(_cifar_resnet, 50),
    "smallcnn": _small_cnn,
    "mlp": _mlp,
    "gpt": gpt,
}
assert tuple(MODELS) == BUILTIN_MODELS  # the config validates names against BUILTIN_MODELS


def _torchvision(spec: Spec) -> Callable[..., nn.Module]:
    import torchvision.models as tvm

    names = tvm.list_models(module=tvm)  # the classification builders only
    if spec.name not in names:
        raise SpecError(
            f"--model {spec.text}: {spec.name} is not a classification model of "
            f"torchvision.models (e.g. resnet18, mobilenet_v3_small, vit_b_16; all {len(names)}: "
            "torchvision.models.list_models(module=torchvision.models))"
        )
    return partial(tvm.get_model, spec.name)


def build_model(
    spec: str | Spec,
    *,
    num_classes: int | None,
    input_shape: tuple[int, ...] | None = None,
    model_args: Mapping[str, Any] | None = None,
) -> nn.Module:
    """A fresh model for `spec` (call after seeding). `num_classes` and `input_shape` (of one
    sample) are passed to a factory that has parameters of those names; a torchvision builder
    always gets `num_classes`. Raises SpecError (one line) for any misuse."""
    if isinstance(spec, str):
        spec = parse_spec("--model", spec, BUILTIN_MODELS, torchvision=True)
    kwargs = dict(model_args or {})
    provided: dict[str, Any] = {"num_classes": num_classes, "input_shape": input_shape}
    provided = {k: v for k, v in provided.items() if v is not None}
    if spec.kind == "builtin":
        fn: Callable[..., Any] = MODELS[spec.name]
    elif spec.kind == "torchvision":
        fn = _torchvision(spec)
        if num_classes is not None:
            kwargs.setdefault("num_classes", num_classes)
    else:
        fn = load_function("--model", spec)
    model = call_factory(
        fn, flag="--model", spec=spec, args_flag="--model-args", kwargs=kwargs, provided=provided
    )
    if not isinstance(model, nn.Module):
        raise SpecError(
            f"--model {spec.text} returned {type(model).__name__}, not a torch.nn.Module; "
            "make the factory return the model"
        )
    return model
