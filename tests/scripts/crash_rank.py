"""Rank 1 raises at its fourth step; rank 0 would wait in the next all-reduce."""

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    if step == 3 and dist.get_rank() == 1:
        raise RuntimeError("out of patience at step 3")
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
