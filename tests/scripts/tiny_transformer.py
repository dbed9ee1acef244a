"""A transformer trainer: dict batches passed as keyword arguments, AdamW, gradient clipping and
zero_grad at the end of the loop."""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 6
VOCAB, SEQ, BATCH = 64, 16, 4


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        layer = nn.TransformerEncoderLayer(32, 2, dim_feedforward=64, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, input_ids, labels):
        logits = self.head(self.encoder(self.embed(input_ids)))
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(TinyLM())
else:
    model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(STEPS):
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
    loss = model(**batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
print("trained", STEPS, "steps")
