"""Inference only: a forward, never an optimizer step."""

import torch
from torch import nn

model = nn.Linear(8, 2)
for _ in range(3):
    model(torch.randn(4, 8)).sum().backward()
print("no optimizer here")
