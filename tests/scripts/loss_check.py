"""A training check as CI jobs write them: train briefly, then exit 3 when the loss did not
reach the target (`sys.exit(0 if ok else 3)`)."""

import argparse
import sys

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--target-loss", type=float, default=1e-6)
args = parser.parse_args()

model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(4):
    x = torch.randn(16, 8)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.4f} (target {args.target_loss})")
sys.exit(0 if loss.item() < args.target_loss else 3)
