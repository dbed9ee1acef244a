"""torch-tb-profiler 0.4.3's Distributed-view split, [computation, overlapping, communication,
other] per step, reproduced rule for rule so `tb_split` shows what TensorBoard shows.

The rules are tb-profiler's own (torch_tb_profiler/profiler/trace.py `create_trace_event`,
event_parser.py `_parse_node` / `_parse_step` / `_find_device_steps` / `_update_steps_duration`,
overall_parser.py `aggregate`, run_generator.py `_generate_overlap_graph`), quirks included; they
are listed in docs/reference/metrics.md §4a. dpscope's own compute/comm/overlap (rank.py) deliberately
differ: this module exists only so the two tools' figures can be compared like for like.

classify.py feeds it chunk by chunk from its own buckets, so no event is looked at twice: kernels
with the ids classify already decoded (`add_kernels`), the few host-side events whose role needs
their name (`add_host`), and at the end the bulk of plain CPU operators as arrays (`finish`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.trace.events import Args
from analysis.trace.intervals import clip, intersection_us, merge, total_us
from analysis.trace.roles import TB_ANN, TB_DEVICE, TB_KERNEL, TB_OP, TB_RUNTIME

__all__ = ["NO_ID", "TB_COMM_NAMES", "TbAccumulator", "TbRoles", "tb_split"]

# trace.py NcclOpNameSet + GlooOpNameSet: exact names, nothing else is a collective to tb-profiler
# (no all_to_all, no _all_gather_base, no *_coalesced, no mpi/ucc).
TB_COMM_NAMES = frozenset(
    f"{lib}:{op}"
    for lib in ("nccl", "gloo")
    for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")
)
NO_ID = -(1 << 62)  # an absent id: tb-profiler keys it as None, which still matches other Nones


def _ids(a: Args | None) -> tuple[int, int]:
    """(external id, correlation id) as tb-profiler reads them ('external id' first)."""
    if a is None:
        return NO_ID, NO_ID
    ext = a.external_id_lc if a.external_id_lc is not None else a.external_id
    return (NO_ID if ext is None else ext), (NO_ID if a.correlation is None else a.correlation)


_DATALOADER = ("enumerate(DataLoader)#", "enumerate(DataPipe)#")


def _is_dataloader(name: str) -> bool:
    return (
        name.startswith("enumerate(DataLoader)#") and name.endswith(".__next__")
    ) or name.startswith("enumerate(DataPipe)#")


@dataclass
class TbRoles:
    """tb-profiler's role ranges and steps for one trace (µs relative to the rank's origin)."""

    kernels: tuple[np.ndarray, np.ndarray]  # Kernel role (non-communication kernels)
    has_kernel: bool  # tb-profiler tests the role list, zero-length kernels included
    cpu_ops: tuple[np.ndarray, np.ndarray]  # CpuOp role
    comm: tuple[np.ndarray, np.ndarray]  # Communication role (calls + their kernels)
    steps: list[tuple[float, float]]  # after tb-profiler's device-side adjustment


HostEvent = tuple[int, str, float, float, Args | None]  # (tb type, name, start, end, args)


class TbAccumulator:
    """Collects what tb-profiler's split needs, one chunk of events at a time."""

    def __init__(self) -> None:
        self.kernel: list[np.ndarray] = []  # (n, 2) start/end pieces of the Kernel role
        self.kernel_ext: list[np.ndarray] = []
        self.cpu: list[tuple[float, float]] = []
        self.comm: list[tuple[float, float]] = []
        self.comm_ids: set[int] = set()
        self.steps: list[tuple[float, float]] = []
        # Host events not in `cpu` or `steps` (DataLoader ops, collective ops): for the host span.
        self.host: list[tuple[float, float]] = []
        # Device nodes and runtimes in event order, for linking by correlation id: pieces of
        # (is_runtime, ts, end, corr) arrays.
        self.linked: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.has_runtime = False

    @property
    def first(self) -> float:
        """Earliest start of any event kept (every one is in one of these lists)."""
        firsts = [
            min(t for t, *_ in xs) for xs in (self.cpu, self.steps, self.host, self.comm) if xs
        ]
        firsts += [float(p[1].min()) for p in self.linked if p[1].size]
        return min(firsts, default=np.inf)

    def add_kernels(
        self,
        tb_type: np.ndarray,
        ts: np.ndarray,
        end: np.ndarray,
        ext: np.ndarray,
        corr: np.ndarray,
    ) -> None:
        """GPU activities (their tb-profiler types) with their external and correlation ids;
        absent ids as `NO_ID`."""
        is_k = tb_type == TB_KERNEL
        self.kernel.append(np.column_stack([ts[is_k], end[is_k]]))
        self.kernel_ext.append(ext[is_k])
        lk = is_k | (tb_type == TB_DEVICE)
        self.linked.append((np.zeros(int(lk.sum()), np.int8), ts[lk], end[lk], corr[lk]))

    def add_host(self, events: list[HostEvent]) -> None:
        """Host-side events tb-profiler keeps (their type is not dropped), in event order."""
        linked: list[tuple[int, float, float, int]] = []
        for kind, name, ts, end, args in events:
            if kind == TB_ANN:
                if name.startswith("ProfilerStep#"):
                    kind = TB_OP  # a ProfilerStep event whatever its category
                elif name not in TB_COMM_NAMES:
                    continue  # every other user annotation is dropped
            if kind in (TB_KERNEL, TB_DEVICE, TB_RUNTIME):
                ext, corr = _ids(args)
                if kind == TB_KERNEL:
                    self.kernel.append(np.array([[ts, end]]))
                    self.kernel_ext.append(np.array([ext], np.int64))
                linked.append((int(kind == TB_RUNTIME), ts, end, corr))
                self.has_runtime |= kind == TB_RUNTIME
            else:
                self._add_cpu(kind, name, ts, end, args)
        if linked:
            cols = zip(*linked, strict=True)
            dtypes = (np.int8, np.float64, np.float64, np.int64)
            self.linked.append(tuple(np.array(c, d) for c, d in zip(cols, dtypes, strict=True)))

    def _add_cpu(self, kind: int, name: str, ts: float, end: float, args: Args | None) -> None:
        """A host event that is no device event or runtime: its role by tb-profiler's rules."""
        if name in TB_COMM_NAMES:
            self.comm.append((ts, end))
            self.comm_ids.add(_ids(args)[0])
            if kind != TB_ANN:
                self.host.append((ts, end))
        elif kind == TB_OP and name.startswith("ProfilerStep#"):
            self.steps.append((ts, end))
        elif kind == TB_OP and _is_dataloader(name):
            self.host.append((ts, end))  # DataLoader role: not part of the split
        else:
            self.cpu.append((ts, end))

    def finish(self, origin: float, ops_start: np.ndarray, ops_end: np.ndarray) -> TbRoles:
        """Roles and steps relative to `origin`; `ops_*` (already relative) are plain CPU
        operators (`cpu_op`, none of the names add_host looks at): all CpuOp role."""
        kernel = np.concatenate([np.empty((0, 2)), *self.kernel])
        ext = np.concatenate([np.empty(0, np.int64), *self.kernel_ext])
        is_comm = np.isin(ext, np.array(sorted(self.comm_ids), np.int64))
        comm = np.concatenate([np.array(self.comm).reshape(-1, 2), kernel[is_comm]])
        ops = np.column_stack([ops_start + origin, ops_end + origin])
        cpu = np.concatenate([np.array(self.cpu).reshape(-1, 2), ops])
        steps = list(self.steps)
        host = np.concatenate([np.array(self.host).reshape(-1, 2), cpu])
        if not steps and host.size:  # one step over the host-side events
            steps = [(float(host[:, 0].min()), float(host[:, 1].max()))]
        if self.has_runtime:
            cols = [np.concatenate(c).tolist() for c in zip(*self.linked, strict=True)]
            steps = _device_steps(steps, list(zip(*cols, strict=True)))

        def rel(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return merge(a[:, 0] - origin, a[:, 1] - origin)

        return TbRoles(
            kernels=rel(kernel[~is_comm]),
            has_kernel=bool((~is_comm).any()),
            cpu_ops=rel(cpu),
            comm=rel(comm),
            steps=[(s - origin, e - origin) for s, e in steps],
        )


def _device_steps(steps: list, linked: list) -> list[tuple[float, float]]:
    """event_parser.py `_find_device_steps` + `_update_steps_duration`: when runtimes launched
    device work inside the steps, each step ends at its last device event, starts no earlier than
    the previous step's end, and trailing steps with (almost) no device work are removed."""
    runtimes, devices = _link_runtimes(linked)
    if not runtimes or not steps:
        return steps
    runtimes.sort(key=lambda r: r[0])
    dev_span, matched_n, matched = _match_steps(steps, runtimes, devices)
    if not matched:
        return steps
    prev_end = steps[0][0]
    if np.isfinite(dev_span[0][0]):
        for i, (_, d_end) in enumerate(devices):
            if i not in matched and d_end < dev_span[0][0]:
                prev_end = max(prev_end, d_end)
    out = []
    for (s, e), (d_lo, d_hi) in zip(steps, dev_span, strict=True):
        start = max(prev_end, s)
        end = max(e, start) if not np.isfinite(d_lo) else max(max(e, d_hi), start)
        out.append((start, end))
        prev_end = end
    if len(out) > 1:
        last = max((i for i in range(len(steps)) if matched_n[i] > 0), default=-1)
        if last >= 0:
            keep = last + 1
            if last > 0 and matched_n[last - 1] * 0.8 > matched_n[last]:
                keep = last
            out = out[:keep]
    return out


def _link_runtimes(linked: list) -> tuple[list[list], list[tuple[float, float]]]:
    """(runtimes as [start, end, device node indices], device events), linked on correlation
    ids in event order as tb-profiler does (a device event may come before its runtime)."""
    runtimes: list[list] = []
    devices: list[tuple[float, float]] = []
    by_corr: dict[int, list] = {}
    pending: dict[int, list[int]] = {}
    for is_rt, ts, end, corr in linked:
        if is_rt:
            rt = [ts, end, pending.pop(corr, [])]
            by_corr[corr] = rt
            runtimes.append(rt)
        else:
            devices.append((ts, end))
            if corr in by_corr:
                by_corr[corr][2].append(len(devices) - 1)
            else:
                pending.setdefault(corr, []).append(len(devices) - 1)
    return runtimes, devices


def _match_steps(
    steps: list, runtimes: list[list], devices: list[tuple[float, float]]
) -> tuple[list[tuple[float, float]], list[int], set[int]]:
    """Walk steps and start-sorted runtimes together: per step the span of the device events its
    runtimes launched (inf, -inf when none) and how many; plus every matched device index."""
    n = len(steps)
    dev_span = [(np.inf, -np.inf)] * n
    matched_n = [0] * n
    matched: set[int] = set()
    i_step = i_rt = 0
    lo, hi = np.inf, -np.inf
    while i_step < n and i_rt < len(runtimes):
        s, e = steps[i_step]
        r_s, r_e, nodes = runtimes[i_rt]
        if r_s < s:
            i_rt += 1
        elif r_e <= e:
            for d in nodes:
                lo, hi = min(devices[d][0], lo), max(devices[d][1], hi)
                matched.add(d)
                matched_n[i_step] += 1
            i_rt += 1
        elif r_s < e:
            i_rt += 1
        else:
            dev_span[i_step] = (lo, hi)
            i_step += 1
            lo, hi = np.inf, -np.inf
    while i_step < n:
        dev_span[i_step] = (lo, hi)
        lo, hi = np.inf, -np.inf
        i_step += 1
    return dev_span, matched_n, matched


def tb_split(roles: TbRoles) -> dict[str, float | None]:
    """tb-profiler's per-step [computation, overlapping, communication, other], averaged over its
    steps (µs; TensorBoard shows the same means truncated to whole µs). Per step S:
    comp = |S ∩ kernels| (|S ∩ CPU ops| when the trace has no computation kernel),
    comm = |S ∩ communication|, overlapping = |S ∩ comp ∩ comm|, computation = comp − overlapping,
    communication = comm − overlapping, other = |S| − comp − comm + overlapping."""
    keys = ("computation", "overlapping", "communication", "other")
    if not roles.steps:
        return dict.fromkeys(keys)
    comp_all = roles.kernels if roles.has_kernel else roles.cpu_ops
    acc = np.zeros(4)
    for s, e in roles.steps:
        comp, comm = clip(comp_all, s, e), clip(roles.comm, s, e)
        overlap = intersection_us(comp, comm)
        comp_us, comm_us = total_us(comp), total_us(comm)
        acc += [
            comp_us - overlap,
            overlap,
            comm_us - overlap,
            (e - s) - comp_us - comm_us + overlap,
        ]
    acc = np.maximum(acc / len(roles.steps), 0.0)  # -1e-12 from float cancellation
    return dict(zip(keys, acc.tolist(), strict=True))
