"""`--dataset`: the built-in datasets (a registry) or a factory from the user's code, and the one
sampler every mode draws its batches from.

The built-in image datasets are delivered as 3x32x32; `tokens` as (seq_len,) token ids. A user
factory returns `(train, test)` map-style datasets of `(input, target)` pairs of any shape
(`test` may be None: no eval); see docs/guides/own-model.md.

Identical data order in every mode: each epoch has ONE global permutation of the training split
seeded by `seed` and the epoch (workloads.train.permutation: computed at the positions a replica
reads, never materialised, so memory does not grow with the dataset's claimed length); optimizer
step s consumes positions [s*G, (s+1)*G) of it (G = global batch), and replica r takes the
contiguous slice [r*B, (r+1)*B) of that global batch (B = G / replicas).
Single-device and DataParallel runs are one replica of the same sampler (they take all G), so a
DDP step sees exactly the samples the single-device step sees, only split across ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler, Subset, TensorDataset

from profiler.runfolder.errors import UserError
from workloads.spec import BUILTIN_DATASETS, Spec, SpecError, parse_spec
from workloads.train.factory import call_factory, exit_call, last_line, load_function
from workloads.train.permutation import permute

__all__ = [
    "DATASETS",
    "DataError",
    "Datasets",
    "GlobalBatchSampler",
    "build_datasets",
    "check_available",
    "dataset_item",
    "eval_loader",
    "train_loader",
]

# The synthetic data is fixed (independent of --seed): seeds vary init and order, not the task.
_SYNTHETIC_SEED = 1234
SYNTHETIC_TRAIN = 2048
SYNTHETIC_TEST = 512
_CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}


class DataError(UserError, ValueError):
    """A dataset is missing or unusable; the message says what to do."""


@dataclass(frozen=True, kw_only=True)
class Datasets:
    """Train and test splits plus the number of classes."""

    train: Dataset
    test: Dataset | None
    """None: the dataset has no test split, so the run has no eval."""
    num_classes: int | None
    """Classes (token ids for `tokens`); None when a user dataset does not say."""


def _synthetic(num_classes: int = 10) -> Datasets:
    # Labels come from a fixed random linear teacher on an 8x8 version of the image, and the
    # 32x32 input is that image upsampled plus noise: learnable by the MLP and by the CNNs alike.
    g = torch.Generator().manual_seed(_SYNTHETIC_SEED)
    n = SYNTHETIC_TRAIN + SYNTHETIC_TEST
    low = torch.randn(n, 3, 8, 8, generator=g)
    teacher = torch.randn(3 * 8 * 8, num_classes, generator=g)
    labels = (low.flatten(1) @ teacher).argmax(dim=1)
    images = F.interpolate(low, size=(32, 32), mode="bilinear", align_corners=False)
    images += 0.3 * torch.randn(images.shape, generator=g)
    return Datasets(
        train=TensorDataset(images[:SYNTHETIC_TRAIN], labels[:SYNTHETIC_TRAIN]),
        test=TensorDataset(images[SYNTHETIC_TRAIN:], labels[SYNTHETIC_TRAIN:]),
        num_classes=num_classes,
    )


def _tokens(
    *, vocab_size: int = 2048, seq_len: int = 64, num_train: int = 2048, num_test: int = 256
) -> Datasets:
    """Sequences sampled from a fixed random bigram teacher: each token has 4 possible successors
    with fixed random probabilities, so a language model's loss falls from ln(vocab_size) towards
    the teacher's entropy (under ln 4). Input: tokens [0, seq_len), target: tokens [1, seq_len]."""
    if vocab_size < 2 or seq_len < 1 or num_train < 1 or num_test < 0:
        raise ValueError(
            "tokens needs vocab_size >= 2, seq_len >= 1, num_train >= 1 and num_test >= 0"
        )
    g = torch.Generator().manual_seed(_SYNTHETIC_SEED)
    successors = torch.randint(vocab_size, (vocab_size, 4), generator=g)
    weights = torch.rand(vocab_size, 4, generator=g) + 0.1
    n = num_train + num_test
    seq = torch.empty(n, seq_len + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(vocab_size, (n,), generator=g)
    for t in range(seq_len):  # every sequence advances one token per iteration
        cur = seq[:, t]
        pick = torch.multinomial(weights[cur], 1, generator=g).squeeze(1)
        seq[:, t + 1] = successors[cur, pick]
    x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()  # (n, seq_len) each
    return Datasets(
        train=TensorDataset(x[:num_train], y[:num_train]),
        test=TensorDataset(x[num_train:], y[num_train:]) if num_test else None,
        num_classes=vocab_size,
    )


def _digits() -> Datasets:
    from sklearn.datasets import load_digits  # ships with scikit-learn: no download

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32) / 16.0  # (N, 8, 8) in [0, 1]
    y = torch.tensor(bunch.target, dtype=torch.long)
    # Grey 8x8 -> 3x32x32 so every model (built for CIFAR shapes) runs unchanged.
    x = F.interpolate(x[:, None], size=(32, 32), mode="bilinear", align_corners=False)
    x = ((x - 0.5) / 0.5).expand(-1, 3, -1, -1).contiguous()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(_SYNTHETIC_SEED))
    n_test = len(y) // 5
    test, train = perm[:n_test], perm[n_test:]
    return Datasets(
        train=TensorDataset(x[train], y[train]),
        test=TensorDataset(x[test], y[test]),
        num_classes=10,
    )


def check_available(name: str, data_dir: str, *, download: bool) -> None:
    """Raise DataError (one line, with the fix) when a dataset cannot be loaded offline."""
    if name in _CIFAR_FOLDERS and not download:
        folder = Path(data_dir) / _CIFAR_FOLDERS[name]
        if not folder.is_dir():
            raise DataError(
                f"{name} not found at {folder}: pass --download (needs internet) or point "
                f"--data-dir at the folder that contains {_CIFAR_FOLDERS[name]}"
            )


def _cifar(name: str, data_dir: str, *, download: bool) -> Datasets:
    from torchvision import datasets, transforms

    check_available(name, data_dir, download=download)
    cls, num_classes = (datasets.CIFAR10, 10) if name == "cifar10" else (datasets.CIFAR100, 100)
    tf = transforms.Compose(
        [
            transforms.ToTensor(),
            transforms.Normalize((0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)),
        ]
    )
    try:
        train = cls(root=data_dir, train=True, transform=tf, download=download)
        test = cls(root=data_dir, train=False, transform=tf, download=download)
    except (
        RuntimeError,
        OSError,
    ) as exc:  # torchvision: "Dataset not found or corrupted", URL errors
        raise DataError(f"{name} could not be loaded from --data-dir {data_dir}: {exc}") from exc
    return Datasets(train=train, test=test, num_classes=num_classes)


DATASETS: dict[str, Callable[..., Datasets]] = {
    "synthetic": lambda: _synthetic(),
    "digits": _digits,
    "cifar10": lambda *, data_dir, download: _cifar("cifar10", data_dir, download=download),
    "cifar100": lambda *, data_dir, download: _cifar("cifar100", data_dir, download=download),
    "tokens": _tokens,
}
assert tuple(DATASETS) == BUILTIN_DATASETS  # the config validates names against BUILTIN_DATASETS


def _is_pair(item: Any) -> bool:
    return isinstance(item, tuple | list) and len(item) == 2


def _num_classes(train: Dataset) -> int | None:
    """`train.num_classes` when the dataset has it; else, for a TensorDataset whose targets are
    integers, max + 1; else None (a factory that needs it then asks for it in --model-args)."""
    declared = getattr(train, "num_classes", None)
    if isinstance(declared, int):
        return declared
    if isinstance(train, TensorDataset) and not train.tensors[-1].is_floating_point():
        return int(train.tensors[-1].max()) + 1
    return None


def dataset_item(spec: Spec | str, split: str, ds: Dataset, index: int) -> Any:
    """`ds[index]`, with an exception (or a sys.exit) of the user's __getitem__ as one SpecError
    line naming the dataset, the split and the index."""
    text = spec.text if isinstance(spec, Spec) else spec
    try:
        return ds[index]
    except SystemExit as exc:
        raise SpecError(
            f"--dataset {text}: {split}[{index}] called {exit_call(exc)}; __getitem__ must "
            "return (input, target)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the user's dataset failing is a user error
        raise SpecError(
            f"--dataset {text}: {split}[{index}] raised {last_line(exc)}; fix its __getitem__"
        ) from exc


def _user_datasets(spec: Spec, result: Any) -> Datasets:
    """Check what a user dataset factory returned: two map-style datasets of pairs."""
    if not _is_pair(result):
        raise SpecError(
            f"--dataset {spec.text} returned {type(result).__name__}, not two datasets; "
            "return (train, test) (test may be None)"
        )
    train, test = result
    for split, ds in (("train", train), ("test", test)):
        if ds is None and split == "test":
            continue
        if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")):
            raise SpecError(
                f"--dataset {spec.text}: its {split} split ({type(ds).__name__}) is not a "
                "map-style dataset; give it __len__ and __getitem__ (e.g. a TensorDataset)"
            )
        if len(ds) == 0:
            raise SpecError(f"--dataset {spec.text}: its {split} split is empty")
        first = dataset_item(spec, split, ds, 0)
        if not _is_pair(first):
            raise SpecError(
                f"--dataset {spec.text}: {split}[0] is {type(first).__name__}, not an "
                "(input, target) pair; make __getitem__ return (input, target)"
            )
    return Datasets(train=train, test=test, num_classes=_num_classes(train))


def build_datasets(
    spec: str | Spec,
    data_dir: str = "data",
    *,
    download: bool = False,
    dataset_args: Mapping[str, Any] | None = None,
) -> Datasets:
    """The splits of `spec`: a built-in (synthetic | digits | cifar10 | cifar100 | tokens) or a
    user factory, called with `dataset_args` (and `data_dir` / `download` when it has parameters
    of those names). Raises DataError or SpecError, one line each."""
    if isinstance(spec, str):
        spec = parse_spec("--dataset", spec, BUILTIN_DATASETS)
    fn = DATASETS[spec.name] if spec.kind == "builtin" else load_function("--dataset", spec)
    try:
        result = call_factory(
            fn,
            flag="--dataset",
            spec=spec,
            args_flag="--dataset-args",
            kwargs=dataset_args or {},
            provided={"data_dir": data_dir, "download": download},
        )
    except SpecError as exc:
        if isinstance(exc.__cause__, DataError):  # a built-in's own message says what to do
            raise exc.__cause__ from None
        raise
    return result if spec.kind == "builtin" else _user_datasets(spec, result)


class GlobalBatchSampler(Sampler[list[int]]):
    """Yields this replica's share of each global batch of the epoch's global permutation."""

    def __init__(
        self, *, num_samples: int, global_batch: int, rank: int, replicas: int, seed: int
    ) -> None:
        if global_batch % replicas:
            raise ValueError(f"global batch {global_batch} is not divisible by {replicas} replicas")
        if num_samples < global_batch:
            raise DataError(
                f"the training split has {num_samples} samples, fewer than one global batch of "
                f"{global_batch}; lower --batch-size"
            )
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.per_replica = global_batch // replicas
        self.rank = rank
        self.seed = seed
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, *, start: int = 0) -> None:
        """Select the epoch's permutation; `start` skips steps already done (resuming)."""
        self.epoch = epoch
        self.start = start

    def __len__(self) -> int:
        """Optimizer steps per epoch (the last partial global batch is dropped)."""
        return self.num_samples // self.global_batch

    def __iter__(self):
        # The epoch's order is permute(·, n, "seed:epoch"), evaluated only at the positions this
        # replica reads: memory is one batch whatever the dataset's length (workloads.train.permutation).
        lo = self.rank * self.per_replica
        offsets = torch.arange(self.per_replica, dtype=torch.int64)
        for step in range(self.start, len(self)):
            positions = offsets + (step * self.global_batch + lo)
            yield permute(positions, self.num_samples, f"{self.seed}:{self.epoch}").tolist()


def train_loader(
    dataset: Dataset, sampler: GlobalBatchSampler, *, num_workers: int, pin_memory: bool
) -> DataLoader:
    """DataLoader over the global-order sampler (its batches are this replica's share)."""
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )


def eval_loader(
    dataset: Dataset,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    num_workers: int,
    pin_memory: bool,
    max_samples: int = 0,
) -> DataLoader:
    """This rank's contiguous shard of the evaluated test samples (the first `max_samples` of the
    split, 0 = all), without padding, so that the sums over all ranks cover every evaluated
    sample exactly once (the same numbers as a single-device eval)."""
    n = min(len(dataset), max_samples) if max_samples else len(dataset)
    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    return DataLoader(
        Subset(dataset, range(lo, hi)),
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        pin_memory=pin_memory,
    )
