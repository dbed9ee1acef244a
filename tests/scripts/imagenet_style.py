"""Shaped like PyTorch's ImageNet example (examples/imagenet/main.py) with `--dummy` data: no
step limit (an epoch of --dummy is 1.28 M images), DDP when torchrun's WORLD_SIZE says so,
and its own per-iteration timer (`batch_time`, from the end of one iteration to the end of
the next), printed every --print-freq iterations."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("-j", "--workers", default=0, type=int, help="data loading workers")
parser.add_argument("--epochs", default=90, type=int)
parser.add_argument("-b", "--batch-size", default=16, type=int)
parser.add_argument("--lr", default=0.1, type=float)
parser.add_argument("-p", "--print-freq", default=10, type=int)
parser.add_argument("--width", default=8, type=int, help="channels of the small CNN")
parser.add_argument("--dummy", action="store_true", help="use fake data to benchmark")


class FakeData(Dataset):
    """Like torchvision.datasets.FakeData: the same random images every epoch."""

    def __init__(self, size: int, shape=(3, 32, 32), classes: int = 10) -> None:
        self.size, self.shape, self.classes = size, shape, classes

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.shape, generator=g), int(
            torch.randint(self.classes, (1,), generator=g)
        )


class AverageMeter:
    def __init__(self, name: str) -> None:
        self.name, self.val, self.sum, self.count = name, 0.0, 0.0, 0

    def update(self, val: float) -> None:
        self.val, self.sum, self.count = val, self.sum + val, self.count + 1


def main() -> None:
    args = parser.parse_args()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group(backend="gloo", init_method="env://")
    w = args.width
    model = nn.Sequential(
        nn.Conv2d(3, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(2 * w, 10),
    )  # fmt: skip
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    train_dataset = FakeData(1281167)
    sampler = DistributedSampler(train_dataset) if distributed else None
    train_loader = DataLoader(
        train_dataset,
        batch_size=args.batch_size,
        shuffle=sampler is None,
        num_workers=args.workers,
        sampler=sampler,
    )
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        train(train_loader, model, criterion, optimizer, epoch, args)


def train(train_loader, model, criterion, optimizer, epoch, args) -> None:
    batch_time = AverageMeter("Time")
    model.train()
    end = time.perf_counter()
    for i, (images, target) in enumerate(train_loader):
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batch_time.update(time.perf_counter() - end)
        end = time.perf_counter()
        if i % args.print_freq == 0:
            print(
                f"Epoch: [{epoch}][{i}] Time {batch_time.val:.6f} Loss {loss.item():.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
