"""Each step's loss is averaged over the ranks for logging; rank 1 stalls before its 5th
all_reduce (pass --own-timeout S to give the process group a timeout of the script's own)."""

import argparse
import time
from datetime import timedelta

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--own-timeout", type=float, default=None)
args = parser.parse_args()
if args.own_timeout is None:
    dist.init_process_group("gloo")
else:
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.own_timeout))
weights = torch.zeros(4, requires_grad=True)
optimizer = torch.optim.SGD([weights], lr=0.1)
for step in range(10):
    loss = ((weights - 1) ** 2).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step == 4 and dist.get_rank() == 1:
        time.sleep(3600)  # a stuck data source, a deadlock: this rank never gets further
    logged = loss.detach()
    dist.all_reduce(logged)
    print(f"step {step} loss {logged.item() / dist.get_world_size():.4f}")
