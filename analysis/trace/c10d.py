"""Name each collective call from the c10d op that issued it, and say which algorithm moved its
bytes (docs/reference/metrics.md §9, "Collectives: named from c10d").

A process group's annotation (`gloo:all_reduce`, `nccl:all_gather`, ...) names what the backend
*ran*, not what the program *asked for*. They differ: gloo (torch 2.14) runs a reduce-scatter
(`c10d::_reduce_scatter_base_`, FSDP2's gradient reduction) as a full all-reduce of the input, so
its annotation reads `gloo:all_reduce`; and gloo's `gloo:all_gather` annotation carries the input
(one shard) as its shape, while nccl-tests sizes an all-gather by its output. The c10d op is what
the program called (`c10d::allreduce_`, `c10d::broadcast_`, `c10d::_allgather_base_`, ...), with
every tensor's shape, on the thread that called it; the annotation may sit on a backend thread
(gloo runs its work on threads of its own) and start later.

Each annotation is matched to the earliest c10d op not yet matched that started no later than it,
whose collective can run as the annotation's algorithm (a reduce-scatter as an all-reduce too)
and whose input has the annotation's element count (when both are known): backends start their
work in the order it was issued, so this pairs them one to one. A matched call is then:

- **named** `<backend>:<collective>` from the c10d op where the backend ran another algorithm
  (`gloo:reduce_scatter`), else by its annotation (`gloo:all_gather`, `nccl:_all_gather_base`);
- **sized** the nccl-tests way from the op's own tensors: all-gather by its output, every other
  collective by its input;
- given its **algorithm**, the annotation's name (`gloo:all_reduce`), whose bus factor the
  busbw uses: the bytes a ring of that algorithm moves per rank (an all-reduce moves
  2(n−1)/n × size, a reduce-scatter (n−1)/n × size);
- given its **phase**: the loop phase (forward, backward, optimizer) its c10d op started in.

An annotation with no c10d op (a trace recorded without shapes, or a backend that calls the
process group directly) keeps its own name, size and algorithm.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from analysis.trace.classify import Classified
from analysis.trace.events import decode_list

__all__ = ["PHASE_CODES", "Issued", "algorithm_of", "issued_calls", "phase_name"]

# c10d op -> (collective, index of the tensor nccl-tests sizes it by, index of its input).
_OPS = {
    "c10d::allreduce_": ("all_reduce", 0, 0),
    "c10d::allreduce_coalesced_": ("all_reduce", 0, 0),
    "c10d::broadcast_": ("broadcast", 0, 0),
    "c10d::reduce_": ("reduce", 0, 0),
    "c10d::_allgather_base_": ("all_gather", 0, 1),
    "c10d::allgather_": ("all_gather", 0, 1),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", 0, 1),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", 1, 1),
    "c10d::reduce_scatter_": ("reduce_scatter", 1, 1),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, 1),
    "c10d::alltoall_base_": ("all_to_all", 1, 1),
    "c10d::alltoall_": ("all_to_all", 1, 1),
    "c10d::gather_": ("gather", 0, 1),
    "c10d::scatter_": ("scatter", 1, 1),
}
# The algorithms a backend may run each collective as (beyond the collective itself).
_RUNS_AS = {"reduce_scatter": ("all_reduce",)}
PHASE_CODES = {"forward": 1, "backward": 2, "optimizer": 3}
_PHASE_OF_CODE = {v: k for k, v in PHASE_CODES.items()}
_ITEMSIZE = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "double": 8, "float64": 8, "long": 8,
    "long int": 8, "int64": 8, "half": 2, "c10::half": 2, "float16": 2, "bfloat16": 2,
    "c10::bfloat16": 2, "short": 2, "int16": 2, "byte": 1, "char": 1, "bool": 1,
    "unsigned char": 1, "signed char": 1, "int8": 1, "uint8": 1,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Issued:
    """What one annotation's c10d op says about the call."""

    collective: str
    """all_gather | reduce_scatter | all_reduce | broadcast | ...: what the program asked for."""
    nbytes: int | None
    """nccl-tests size from the op's tensors (None when its shapes were not recorded)."""
    phase: int
    """PHASE_CODES of the loop phase the op started in (0: none)."""


def phase_name(code: float) -> str | None:
    """forward | backward | optimizer for a phase code (None for 0 / unknown)."""
    return _PHASE_OF_CODE.get(int(code))


def _flat(dims: object) -> list[list]:
    """The tensor shapes in one Input Dims entry (a shape, or a TensorList of shapes)."""
    if isinstance(dims, list) and dims and all(isinstance(d, list) for d in dims):
        return dims
    return [dims] if isinstance(dims, list) else []


def _numel(dims: object) -> int | None:
    shapes = _flat(dims)
    if not shapes or not all(all(isinstance(x, int) for x in s) for s in shapes):
        return None
    return sum(math.prod(s) for s in shapes)


def _itemsize(types: list | None, i: int) -> int | None:
    if not types or i >= len(types):
        return None
    return _ITEMSIZE.get(str(types[i]).lower())


def _op_sizes(name: str, args) -> tuple[int | None, int | None]:
    """(nccl-tests bytes, input element count) of one c10d op from its Input Dims."""
    _, sized, inp = _OPS[name]
    dims = decode_list(args.input_dims) if args is not None else None
    types = decode_list(args.input_type) if args is not None else None
    if not dims or len(dims) <= max(sized, inp):
        return None, None
    numel = _numel(dims[sized])
    size = _itemsize(types, sized)
    if size is None and types and len(types) > sized:
        size = 4 if str(types[sized]) == "TensorList" else None  # dtype not recorded
    nbytes = numel * size if numel is not None and size is not None else None
    return nbytes, _numel(dims[inp])


@functools.lru_cache(maxsize=1024)  # per annotation, thousands a trace, a few distinct names
def algorithm_of(anchor: str) -> str:
    """all_gather, reduce_scatter, all_reduce, ... of an annotation (`gloo:all_reduce`,
    `nccl:_all_gather_base`, `nccl:reduce_scatter_tensor_coalesced`)."""
    op = anchor.split(":", 1)[-1].lstrip("_").lower()
    for key, name in (
        ("allgather", "all_gather"),
        ("all_gather", "all_gather"),
        ("reducescatter", "reduce_scatter"),
        ("reduce_scatter", "reduce_scatter"),
        ("allreduce", "all_reduce"),
        ("all_reduce", "all_reduce"),
        ("alltoall", "all_to_all"),
        ("all_to_all", "all_to_all"),
    ):
        if op.startswith(key):
            return name
    return op


def _phase_codes(phases: list[tuple[str, float, float]], t: np.ndarray) -> np.ndarray:
    """PHASE_CODES of the loop phase containing each time in `t` (0: none); the phases of one
    thread do not overlap."""
    mine = sorted((s, e, PHASE_CODES[n]) for n, s, e in phases if n in PHASE_CODES)
    if not mine or not t.size:
        return np.zeros(t.size, dtype=np.int64)
    start, end, code = (np.array(col) for col in zip(*mine, strict=True))
    idx = np.searchsorted(start, t, side="right") - 1
    inside = (idx >= 0) & (end[np.clip(idx, 0, None)] >= t)
    return np.where(inside, code[np.clip(idx, 0, None)], 0)


def _queues(collective: list[str]) -> dict[str, list[int]]:
    """Per algorithm, the ops (indices, in start order) whose collective can run as it."""
    queues: dict[str, list[int]] = {}
    for k, name in enumerate(collective):
        for algo in (name, *_RUNS_AS.get(name, ())):
            queues.setdefault(algo, []).append(k)
    return queues


def issued_calls(c: Classified) -> list[Issued | None]:
    """Per annotation of `c.anchors` (in their order, i.e. by start), the c10d op that issued it
    (the module docstring), or None when none matches."""
    ops = c.c10d
    known = [i for i, n in enumerate(ops.names) if n in _OPS]
    if not known or not len(c.anchors):
        return [None] * len(c.anchors)
    sizes = [_op_sizes(ops.names[i], ops.args[i]) for i in known]
    starts = ops.start[known]
    codes = _phase_codes(c.memory.phases if c.memory is not None else [], starts)
    collective = [_OPS[ops.names[i]][0] for i in known]
    queues, heads = _queues(collective), {}
    free = [True] * len(known)
    out: list[Issued | None] = []
    for j, anchor in enumerate(c.anchors.names):
        algo = algorithm_of(anchor)
        a_args = c.anchors.args[j] if c.anchors.args else None
        a_dims = decode_list(a_args.input_dims) if a_args else None
        a_numel = _numel(a_dims[0]) if a_dims else None
        queue, hit = queues.get(algo, []), None
        head = heads.get(algo, 0)
        while head < len(queue) and not free[queue[head]]:
            head += 1  # matched through another algorithm's queue
        heads[algo] = head
        for k in queue[head:]:
            if starts[k] > c.anchors.start[j]:
                break
            if free[k] and (a_numel is None or sizes[k][1] in (None, a_numel)):
                hit = k
                break
        if hit is None:
            out.append(None)
            continue
        free[hit] = False
        out.append(Issued(collective=collective[hit], nbytes=sizes[hit][0], phase=int(codes[hit])))
    return out
