"""Models for 3x32x32 inputs: CIFAR-style ResNets (torchvision), a small CNN and an MLP.

Every dataset is delivered as 3x32x32 (see workloads.train.data), so any model runs on any dataset.
The MLP has no BatchNorm on purpose: with no per-replica batch statistics, single-device and DDP
training are mathematically identical, which the equivalence test relies on.
"""

from __future__ import annotations

from torch import nn
from torchvision.models import resnet18, resnet50

__all__ = ["INPUT_SHAPE", "build_model"]

INPUT_SHAPE = (3, 32, 32)


def _cifar_resnet(factory, num_classes: int) -> nn.Module:
    # The ImageNet stem (7x7 stride-2 conv + maxpool) would shrink 32x32 to 8x8 before the first
    # block; the usual CIFAR variant uses a 3x3 stride-1 conv and no maxpool.
    model = factory(num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def _conv_bn_relu(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True)]


def _small_cnn(num_classes: int) -> nn.Module:
    return nn.Sequential(
        *_conv_bn_relu(3, 32),
        nn.MaxPool2d(2),  # 32x16x16
        *_conv_bn_relu(32, 64),
        nn.MaxPool2d(2),  # 64x8x8
        *_conv_bn_relu(64, 128),
        nn.AdaptiveAvgPool2d(1),  # 128x1x1
        nn.Flatten(),
        nn.Linear(128, num_classes),
    )


def _mlp(num_classes: int) -> nn.Module:
    c, h, w = INPUT_SHAPE
    return nn.Sequential(
        nn.Flatten(),  # (N, 3*32*32)
        nn.Linear(c * h * w, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, num_classes),
    )


def build_model(name: str, *, num_classes: int) -> nn.Module:
    """A fresh model; call after seeding so every mode and rank starts from the same weights."""
    if name == "resnet18":
        return _cifar_resnet(resnet18, num_classes)
    if name == "resnet50":
        return _cifar_resnet(resnet50, num_classes)
    if name == "smallcnn":
        return _small_cnn(num_classes)
    if name == "mlp":
        return _mlp(num_classes)
    raise ValueError(f"--model must be one of resnet18, resnet50, smallcnn, mlp; got {name!r}")
