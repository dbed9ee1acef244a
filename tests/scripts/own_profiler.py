"""Runs its own torch.profiler around the loop and writes its own trace next to itself."""

import torch
from torch import nn
from torch.profiler import profile

model = nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
optimizer.zero_grad()
model(torch.randn(4, 8)).sum().backward()
optimizer.step()  # one step before the profiler: dpscope's own session has started by now
with profile() as prof:
    for _ in range(4):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
prof.export_chrome_trace("my_trace.json")
