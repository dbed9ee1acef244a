"""The shape of PyTorch's DDP tutorial for torchrun (intermediate/ddp_tutorial, "elastic"):
it calls init_process_group itself and builds its own DDP. This variant reads its settings
file first, as many training scripts do, and so fails before joining the group when it is
missing."""

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(settings: dict):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"Start running basic DDP example on rank {rank}.")
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=settings["lr"])
    for _ in range(settings["steps"]):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        labels = torch.randn(20, 5)
        loss_fn(outputs, labels).backward()
        optimizer.step()
    dist.destroy_process_group()
    print(f"Finished running basic DDP example on rank {rank}.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="ddp_config.json")
    args = parser.parse_args()
    with open(args.config) as f:  # before init_process_group: a missing file fails here
        demo_basic(json.load(f))
