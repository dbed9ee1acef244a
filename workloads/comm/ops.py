"""The collectives `make bench-comm` times (workloads.comm.bench): their buffers, one call, the
one-time correctness check on rank-valued tensors (and the verdict every rank agrees on), and the
timing of one message size."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["COLLECTIVES", "agreed_check", "check", "time_one"]

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
)


def _buffers(name: str, count: int, n: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) float32 buffers of a `count`-element message (count divisible by n)."""
    small = count // n
    inp = torch.empty(small if name == "all_gather_into_tensor" else count, device=dev)
    out = torch.empty(small if name == "reduce_scatter_tensor" else count, device=dev)
    return inp, out


def _call(name: str, inp: torch.Tensor, out: torch.Tensor) -> None:
    if name == "all_reduce":
        dist.all_reduce(inp)
    elif name == "broadcast":
        dist.broadcast(inp, src=0)
    elif name == "all_gather_into_tensor":
        dist.all_gather_into_tensor(out, inp)
    elif name == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(out, inp)
    else:
        dist.all_to_all_single(out, inp)


def check(name: str, n: int, rank: int, dev: torch.device) -> bool:
    """Run `name` once on rank-valued tensors and compare with the exact result on this rank."""
    count = 4 * n
    inp, out = _buffers(name, count, n, dev)
    idx = torch.arange(inp.numel(), device=dev, dtype=torch.float32)
    chunk = count // n
    if name in ("all_reduce", "broadcast"):
        inp.fill_(rank + 1)
        expect = torch.full_like(inp, n * (n + 1) / 2 if name == "all_reduce" else 1.0)
        _call(name, inp, out)
        return bool(torch.equal(inp, expect))
    if name == "all_gather_into_tensor":
        inp.fill_(rank + 1)
        expect = torch.arange(count, device=dev) // chunk + 1.0
    elif name == "reduce_scatter_tensor":
        inp.copy_((rank + 1) * (idx + 1))
        expect = n * (n + 1) / 2 * (torch.arange(chunk, device=dev) + rank * chunk + 1.0)
    else:  # chunk j of rank r's input goes to rank j's chunk r
        inp.copy_(rank * n + idx // chunk)
        expect = (torch.arange(count, device=dev) // chunk) * n + rank * 1.0
    _call(name, inp, out)
    return bool(torch.equal(out, expect.float()))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def agreed_check(name: str, n: int, rank: int, dev: torch.device) -> tuple[str | None, str | None]:
    """(run.json `checks` entry, why the collective is skipped) after `check` on every rank:
    ("ok", None) when it passed on all of them, no entry when the backend cannot run it."""
    try:
        ok = check(name, n, rank, dev)
    except (RuntimeError, NotImplementedError, ValueError) as exc:
        return None, _first_line(exc)
    flag = torch.tensor([1.0 if ok else 0.0], device=dev)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # every rank agrees on the verdict
    if flag.item() == 1.0:
        return "ok", None
    return "wrong result", "result check failed (wrong values)"


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _compute_for(seconds: float) -> None:
    """Keep this rank's thread busy for `seconds`, as a training step's compute would."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def time_one(
    name: str,
    count: int,
    n: int,
    dev: torch.device,
    warmup: int,
    iters: int,
    gap_s: float = 0.0,
    *,
    twice: bool = False,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Per-iteration seconds of the slowest rank (all-reduce MAX of every rank's times) of the
    call made after `gap_s` of compute; with `twice`, also of a second call right after it
    (back-to-back, the transport awake), so the analysis can tell the idle penalty from the rest;
    and of the same first call on the fastest rank (MIN): the rank that arrived last, which did
    not wait for the others, so its time holds no arrival skew (a rank descheduled at the end of
    its gap delays the slowest rank's time, not this one)."""
    inp, out = _buffers(name, count, n, dev)
    inp.fill_(1.0)
    mine = torch.zeros(2, iters, dtype=torch.float64, device=dev)
    for i in range(warmup + iters):
        dist.barrier()  # every rank starts the iteration together
        _sync(dev)
        if gap_s:
            _compute_for(gap_s)
        t0 = time.perf_counter()
        _call(name, inp, out)
        _sync(dev)
        t1 = time.perf_counter()
        if twice:  # the same call again at once: the back-to-back time
            _call(name, inp, out)
            _sync(dev)
        if i >= warmup:
            mine[0, i - warmup] = t1 - t0
            mine[1, i - warmup] = time.perf_counter() - t1 if twice else 0.0
    fastest = mine[0].clone()
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    dist.all_reduce(fastest, op=dist.ReduceOp.MIN)
    first, second = mine.cpu().numpy()
    return first, (second if twice else None), fastest.cpu().numpy()
