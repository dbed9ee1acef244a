"""A GPT trainer in nanoGPT's shape (train.py): gradient accumulation over micro-steps, a
max_iters limit, and its own timer per iteration (t0 -> t1 around the whole iteration, logged
as `iter N: loss X, time Y ms`)."""

import argparse
import math
import time

import torch
from torch import nn
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--max_iters", type=int, default=10)
parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--block_size", type=int, default=32)
parser.add_argument("--n_embd", type=int, default=64)
parser.add_argument("--n_layer", type=int, default=2)
args = parser.parse_args()

vocab_size = 256
torch.manual_seed(1337)
data = torch.randint(vocab_size, (50_000,))


def get_batch():
    ix = torch.randint(len(data) - args.block_size - 1, (args.batch_size,))
    x = torch.stack([data[i : i + args.block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + args.block_size] for i in ix])
    return x, y


class Block(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, 4, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )

    def forward(self, x):
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, args.n_embd)
        self.wpe = nn.Embedding(args.block_size, args.n_embd)
        self.h = nn.ModuleList(Block(args.n_embd) for _ in range(args.n_layer))
        self.ln_f = nn.LayerNorm(args.n_embd)
        self.lm_head = nn.Linear(args.n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95))
X, Y = get_batch()
t0 = time.time()
for iter_num in range(args.max_iters):
    lr = 6e-4 * 0.5 * (1 + math.cos(math.pi * iter_num / args.max_iters))
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    for _micro_step in range(args.gradient_accumulation_steps):
        logits, loss = model(X, Y)
        loss = loss / args.gradient_accumulation_steps
        X, Y = get_batch()  # prefetch the next batch while the backward runs (on a GPU)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    lossf = loss.item() * args.gradient_accumulation_steps
    print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.3f}ms", flush=True)
