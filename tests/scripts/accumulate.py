"""Gradient accumulation under DDP: ACCUM micro-batches per optimizer step, no_sync on all but
the last."""

import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn

ACCUM, MICRO, STEPS = 2, 4, 6
ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
if ddp:
    dist.init_process_group("gloo")
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
if ddp:
    model = nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(STEPS):
    for micro in range(ACCUM):
        x, y = torch.randn(MICRO, 10), torch.randint(0, 2, (MICRO,))
        last = micro == ACCUM - 1
        with model.no_sync() if ddp and not last else contextlib.nullcontext():
            loss = nn.functional.cross_entropy(model(x), y) / ACCUM
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
if ddp:
    dist.destroy_process_group()
