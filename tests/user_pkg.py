"""A user package as a new user would write it, copied into a temp folder OUTSIDE the repo by the
tests (tests/test_models.py): `userpkg/nets.py` is imported from that folder (the cwd) or from
PYTHONPATH, never from dpscope's tree."""

from __future__ import annotations

from pathlib import Path

NETS = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset


def tiny_net(num_classes, hidden=32, depth=2):
    """No BatchNorm: single and DDP training are identical."""
    layers, width = [nn.Flatten()], 12
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.Tanh()]
        width = hidden
    return nn.Sequential(*layers, nn.Linear(width, num_classes))


def blobs(n=512, classes=3):
    """(train, test) TensorDatasets of (1 x 12) inputs in `classes` learnable clusters."""
    g = torch.Generator().manual_seed(5)
    centers = torch.randn(classes, 12, generator=g) * 2
    y = torch.randint(classes, (n + 128,), generator=g)
    x = (centers[y] + torch.randn(n + 128, 12, generator=g)).view(-1, 1, 12)
    return TensorDataset(x[:n], y[:n]), TensorDataset(x[n:], y[n:])


def images(n=64, n_test=32):
    """Small 3 x 32 x 32 image splits for the torchvision models (random, 10 classes)."""
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(n + n_test, 3, 32, 32, generator=g), torch.randint(10, (n + n_test,), generator=g)
    train = TensorDataset(x[:n], y[:n])
    train.num_classes = 10  # said, not inferred from the targets drawn
    return train, TensorDataset(x[n:], y[n:])


def blobs_no_test():
    train, _ = blobs()
    return train, None


def no_classes_arg():
    return nn.Linear(12, 3)


def forward_fails(num_classes):
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(12, num_classes)

        def forward(self, x):
            raise RuntimeError("user forward is broken on purpose")

    return Broken()


def not_a_module():
    return "a string"


def raises():
    raise RuntimeError("the factory failed on purpose")


def one_dataset():
    return TensorDataset(torch.zeros(4, 12), torch.zeros(4))


def not_pairs():
    return [torch.zeros(12)] * 8, None


def vector_loss(output, target):
    return nn.functional.cross_entropy(output, target, reduction="none")


def sum_loss(output, target):
    return nn.functional.cross_entropy(output, target, reduction="sum") / len(target)
'''


def write_user_package(folder: Path) -> Path:
    """`folder/userpkg/{__init__,nets,broken}.py`; returns `folder`."""
    pkg = folder / "userpkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(NETS)
    (pkg / "broken.py").write_text("import a_module_that_is_not_installed\n")
    return folder
