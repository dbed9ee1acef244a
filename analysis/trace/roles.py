"""What each trace event is to the analysis, decided once per distinct (ph, cat, name) and never
per event: its role (kernel, runtime launch, ProfilerStep, collective call, data range, ...), its
kernel class (HTA's rules), its tb-profiler type and the flags the memory analysis reads.

`Vocab.encode` turns a chunk of events into one integer code per event (one dict lookup on the
event's (ph, cat, name)); every property is then a numpy table indexed by the codes, so
classification is array indexing, with no Python branch per event.
"""

from __future__ import annotations

import re
from operator import attrgetter

import numpy as np

from analysis.trace.events import Event
from analysis.trace.memory import MEMORY_NAME, MEMORY_PEAK_PHASES

__all__ = [
    "ANNOTATION_CATS",
    "COMM",
    "COMM_KERNEL_RE",
    "COMM_OP_RE",
    "COMPUTE",
    "MEMORY",
    "OP_CATS",
    "OTHER",
    "Role",
    "Vocab",
    "kernel_class",
]

# HTA 0.5.0 uses `^nccl.*Kernel`; we also take RCCL/HCCL and modern `ncclDevKernel_*` names.
COMM_KERNEL_RE = re.compile(r"^(nccl|rccl|hccl)|nccl(Dev)?Kernel|^hip.*(nccl|rccl)", re.IGNORECASE)
MEMORY_KERNEL_RE = re.compile(r"^(Memcpy|Memset|dma)")
# CPU-side collective annotations written by c10d: `nccl:all_reduce`, `gloo:broadcast`, ...
COMM_OP_RE = re.compile(r"^(nccl|gloo|mpi|ucc|xccl|hccl):")
COMPUTE, COMM, MEMORY, OTHER = 0, 1, 2, 3

_KERNEL_CATS = {"kernel", "Kernel"}
_MEMORY_CATS = {"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"}
_SYNC_CATS = {"cuda_sync"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "Driver"}
OP_CATS = frozenset({"cpu_op", "Operator"})
ANNOTATION_CATS = frozenset({"user_annotation", "python_function", "Python"})
# Host-side ops that only issue a collective: neither computation nor the collective itself.
_ISSUE_OPS = ("c10d::", "record_param_comms")
_DATA_PREFIXES = ("enumerate(DataLoader)#", "enumerate(DataPipe)#")

# torch-tb-profiler 0.4.3's trace.py EventTypeMap, keyed by the lower-cased `cat`; any other
# category is dropped (tbprofiler.py).
TB_OP, TB_PY, TB_ANN, TB_KERNEL, TB_DEVICE, TB_RUNTIME, TB_NONE = range(7)
_TB_TYPE = {
    "cpu_op": TB_OP,
    "operator": TB_OP,
    "python": TB_PY,
    "user_annotation": TB_ANN,
    "gpu_user_annotation": TB_ANN,
    "kernel": TB_KERNEL,
    "memcpy": TB_DEVICE,
    "gpu_memcpy": TB_DEVICE,
    "memset": TB_DEVICE,
    "gpu_memset": TB_DEVICE,
    "runtime": TB_RUNTIME,  # only the old `Runtime` category: Kineto's `cuda_runtime` is dropped
}


_KEY = attrgetter("ph", "cat", "name")


class Role:
    """What a complete ('X') event is to classify (NONE: kept by nobody)."""

    NONE, KERNEL, RUNTIME, STEP, ANCHOR, DATA, RPC, ISSUE, OP, TB = range(10)


def kernel_class(name: str, cat: str) -> int:
    """COMPUTE, COMM, MEMORY or OTHER for one GPU activity (HTA's rules, docs/reference/metrics.md)."""
    if cat in _MEMORY_CATS or MEMORY_KERNEL_RE.match(name) or "Memcpy" in name:
        return MEMORY
    if COMM_KERNEL_RE.search(name):
        return COMM
    if cat in _SYNC_CATS or "Sync" in name:  # Event/Context Sync: GPU time, not computation
        return OTHER
    return COMPUTE


def _is_data(name: str) -> bool:
    return name == "data" or name.startswith(_DATA_PREFIXES)


def _op_role(name: str, cat: str) -> int:
    """A CPU op or annotation: ProfilerStep, collective call, data range, record_param_comms,
    issue-only op or operator; other user ranges (forward, backward, ...) are not operators."""
    if name.startswith("ProfilerStep#"):
        return Role.STEP
    if COMM_OP_RE.match(name):
        return Role.ANCHOR
    if _is_data(name):
        return Role.DATA
    if name == "record_param_comms":
        return Role.RPC
    if cat not in OP_CATS:
        return Role.TB if cat == "Python" else Role.NONE  # tb-profiler counts these as CPU ops
    if name.startswith(_ISSUE_OPS):
        return Role.ISSUE
    return Role.OP


def role_of(ph: str, cat: str, name: str) -> int:
    """The role of an event with this ph, category and name (Role.NONE unless complete)."""
    if ph != "X":
        return Role.NONE
    if cat in _KERNEL_CATS or cat in _MEMORY_CATS or cat in _SYNC_CATS:
        return Role.KERNEL
    if cat in _RUNTIME_CATS:
        return Role.RUNTIME
    if cat in OP_CATS or cat in ANNOTATION_CATS:
        return _op_role(name, cat)
    return Role.TB  # other categories: only tb-profiler may keep some


class Vocab(dict):
    """(ph, cat, name) -> code, with one row of properties per code (numpy tables `role`,
    `kernel_cls`, `tb_type`, `is_x`, `memory`, `phase`, `annotation`, `op_cat`; lists `names`,
    `cats`). A rank's chunks share one vocabulary, so the tables grow only with new keys."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.cats: list[str] = []
        self._rows: list[tuple[int, int, int, bool, bool, bool, bool, bool]] = []
        self._tables: dict[str, np.ndarray] = {}

    def __missing__(self, key: tuple[str, str, str]) -> int:
        ph, cat, name = key
        code = self[key] = len(self._rows)
        role = role_of(ph, cat, name)
        self.names.append(name)
        self.cats.append(cat)
        self._rows.append(
            (
                role,
                kernel_class(name, cat) if role == Role.KERNEL else -1,
                _TB_TYPE.get(cat.lower(), TB_NONE),
                ph == "X",
                name == MEMORY_NAME,
                name in MEMORY_PEAK_PHASES and ph == "X" and cat == "user_annotation",
                cat in ANNOTATION_CATS,
                cat in OP_CATS,
            )
        )
        self._tables = {}
        return code

    def encode(self, events: list[Event]) -> np.ndarray:
        """One code per event."""
        # map/attrgetter: the per-event work stays in C (a tuple and one dict lookup each)
        return np.fromiter(map(self.__getitem__, map(_KEY, events)), np.int64, len(events))

    def table(self, name: str) -> np.ndarray:
        """The property `name` of every code, as an array indexed by code."""
        if not self._tables:
            cols = list(zip(*self._rows, strict=True)) if self._rows else [()] * 8
            keys = ("role", "kernel_cls", "tb_type", "is_x", "memory", "phase", "annotation")
            dtypes = (np.int8, np.int8, np.int8, bool, bool, bool, bool, bool)
            for key, col, dtype in zip((*keys, "op_cat"), cols, dtypes, strict=True):
                self._tables[key] = np.asarray(col, dtype=dtype)
        return self._tables[name]
