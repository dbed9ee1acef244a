"""`--model gpt`: a small decoder-only transformer language model (GPT-2's layout, nanoGPT-sized).

Token and position embeddings, `n_layer` pre-LayerNorm blocks (causal self-attention through
`F.scaled_dot_product_attention`, then a 4x GELU MLP), a final LayerNorm and a linear head whose
weight IS the token embedding (tied, as GPT-2 has). There is no dropout and no BatchNorm, so single
and DDP training stay identical. Input (N, T) token ids, output (N, T, vocab) logits.

Why it matters for the profile: the tied embedding/head matrix (vocab x n_embd) is the largest
parameter and was registered first, so DDP puts it in the last gradient bucket, and its gradient
is complete only when the backward pass reaches the embedding, at the very end: one large bucket
that is ready last and cannot overlap with backward compute.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "gpt"]


class _Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.Linear(n_embd, 3 * n_embd)  # q, k, v in one matmul
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(c, dim=2)
        # (N, T, C) -> (N, heads, T, C / heads)
        q, k, v = (z.view(n, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(n, t, c))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only transformer; see the module docstring."""

    def __init__(
        self, *, vocab_size: int, block_size: int, n_layer: int, n_embd: int, n_head: int
    ) -> None:
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(_Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.wte.weight  # tied: one parameter, counted and all-reduced once
        for module in self.modules():  # GPT-2's initialisation
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.block_size:
            raise ValueError(
                f"gpt got sequences of {t} tokens, longer than its block_size {self.block_size}; "
                f'raise it with --model-args "block_size={t}"'
            )
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (N, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (N, T, vocab)


def gpt(
    *,
    num_classes: int,
    n_layer: int = 4,
    n_embd: int = 128,
    n_head: int = 4,
    block_size: int = 64,
    vocab_size: int = 0,
) -> GPT:
    """The built-in `gpt`; `vocab_size` 0 takes the dataset's token count (`num_classes`)."""
    vocab = vocab_size or num_classes
    if vocab < num_classes:
        raise ValueError(
            f"vocab_size {vocab} is below the dataset's {num_classes} tokens; drop vocab_size "
            "or raise it"
        )
    for name, value in (("n_layer", n_layer), ("n_embd", n_embd), ("n_head", n_head)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1; got {value}")
    if n_embd % n_head:
        raise ValueError(f"n_embd {n_embd} must be a multiple of n_head {n_head}")
    return GPT(
        vocab_size=vocab, block_size=block_size, n_layer=n_layer, n_embd=n_embd, n_head=n_head
    )
