"""The shape of PyTorch's FSDP2 example (examples/distributed/FSDP2): the script joins the
process group itself, calls fully_shard on each layer and then on the model, and trains with
Adam. A vocabulary of 11 tokens does not split evenly over 2 ranks, so the embedding and the
head are padded shards."""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

VOCAB, DIM, SEQ = 11, 8, 6


class Layer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.relu(self.ff(self.norm(x)))


class Net(nn.Module):
    def __init__(self, n_layers=2):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer(DIM) for _ in range(n_layers))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        h = self.emb(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        tokens = torch.randint(VOCAB, (args.batch, SEQ), generator=gen)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optim.step()
        optim.zero_grad()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
