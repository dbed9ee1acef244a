"""A CNN trainer as users write it: DistributedSampler, DDP when WORLD_SIZE says so, a scheduler,
dist.barrier() and a loss all-reduce for logging every step."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--batch", type=int, default=8)
args = parser.parse_args()

distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
if distributed:
    dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 1, 8, 8), torch.randint(0, 4, (512,)))
sampler = DistributedSampler(data) if distributed else None
loader = DataLoader(data, batch_size=args.batch, sampler=sampler, shuffle=sampler is None)
model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 4))
if distributed:
    model = nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4)
criterion = nn.CrossEntropyLoss()

for step, (x, y) in enumerate(loader):
    if step == args.steps:
        break
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    scheduler.step()
    if distributed:
        dist.barrier()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        logged /= dist.get_world_size()
    else:
        logged = loss.detach()
    print(f"step {step} loss {logged.item():.4f}", flush=True)

with open("cnn_done.txt", "w") as f:  # the script's own output, which dpscope leaves alone
    f.write("done\n")
if distributed:
    dist.destroy_process_group()
