"""Dynamic memory of one rank from the profiler's `[memory]` events: the allocated-bytes curve per
device, and the peak of activations and temporaries in each phase (forward, backward, optimizer).

torch.profiler with `profile_memory=True` writes one instant event `[memory]` per allocation and
free, with `Bytes` (signed), `Total Allocated` (the allocator's running total after it), `Device
Type` (0 CPU, 1 CUDA) and `Device Id`. On CUDA the total is the caching allocator's own count of
allocated bytes, so it includes everything allocated before profiling (parameters, optimizer
state). On CPU the profiler counts only allocations made while it records: the curve starts at 0
when tracing starts, and the frees of older blocks are not seen (a step's level can only be
overstated by them). Both are therefore read *relative* to a level inside the same step:

    phase_peak = max(Total Allocated during the phase, level at its start) − level at the start
                 of the step's `forward` range

and `forward_peak_bytes` / `backward_peak_bytes` / `optimizer_peak_bytes` are the largest of
these over the traced steps. The reference level is taken where forward begins (after the step's
batch is loaded), so what the peaks measure is what the step adds on top of the memory that lives
between steps: activations and temporaries in forward, plus the gradients being created in
backward (`zero_grad(set_to_none=True)` frees them between steps), plus the optimizer's
temporaries. The phases are dpscope's `forward` / `backward` / `optimizer` profiler ranges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec
import numpy as np

from analysis.trace.events import Event, parse_args

__all__ = [
    "MAX_MEMORY_BYTES",
    "MEMORY_NAME",
    "MEMORY_PEAK_PHASES",
    "MemoryAccumulator",
    "MemoryEvents",
    "device_name",
    "downsample",
    "memory_summary",
]

MEMORY_PEAK_PHASES = ("forward", "backward", "optimizer")
MEMORY_NAME = "[memory]"
TIMELINE_POINTS = 1500  # per device per rank: enough for a figure, small in the JSON
# Plausibility bound of a [memory] event: no device holds 1 PiB, and device numbers are small.
MAX_MEMORY_BYTES = 1 << 50
_MAX_DEVICE = 1 << 16
_HUGE = 1e300  # past every bound: where a hostile integer beyond float64 is clamped
_KEY_SPAN = _MAX_DEVICE + 1  # device ids -1 .. _MAX_DEVICE - 1, shifted by one


_PHASE_SET = frozenset(MEMORY_PEAK_PHASES)


def device_name(device_type: int, device_id: int) -> str:
    """`cpu`, `cuda:<id>`, else `device<type>:<id>` (c10's DeviceType numbering)."""
    if device_type == 0:
        return "cpu"
    if device_type == 1:
        return f"cuda:{device_id}"
    return f"device{device_type}:{device_id}"


@dataclass
class MemoryEvents:
    """One rank's `[memory]` events (µs relative to the rank's origin) and phase ranges."""

    ts: np.ndarray
    total: np.ndarray  # Total Allocated after the event (bytes)
    delta: np.ndarray  # Bytes (negative for frees)
    device: list[str]  # one per event
    phases: list[tuple[str, float, float]] = field(default_factory=list)  # (name, start, end)
    dropped: int = 0  # [memory] events dropped as implausible (bounds: docs §11)


class MemoryAccumulator:
    """Collects `[memory]` events and phase ranges chunk by chunk (see analysis.trace.classify)."""

    def __init__(self) -> None:
        # One numpy array per chunk and column: no per-event Python objects outlive the chunk.
        self.ts: list[np.ndarray] = []
        self.total: list[np.ndarray] = []
        self.delta: list[np.ndarray] = []
        self.dtype: list[np.ndarray] = []
        self.did: list[np.ndarray] = []
        self.dropped = 0
        self.phases: list[tuple[str, float, float]] = []

    def add(self, events: list[Event]) -> None:
        """Add events whose `ts` is already relative to the rank's base (tests, tools); `args`
        may be given as raw JSON bytes."""
        events = [
            e
            if not isinstance(e.args, bytes)
            else msgspec.structs.replace(e, args=parse_args(e.args))
            for e in events
        ]
        ts = np.fromiter((e.ts for e in events), np.float64, len(events))
        mem = np.fromiter((e.name == MEMORY_NAME for e in events), bool, len(events))
        phase = np.fromiter(
            (e.name in _PHASE_SET and e.ph == "X" and e.cat == "user_annotation" for e in events),
            bool,
            len(events),
        )
        dur = np.fromiter((e.dur for e in events), np.float64, len(events))
        self.add_chunk(events, ts, dur, mem, phase)

    def add_chunk(
        self,
        events: list[Event],
        ts: np.ndarray,
        dur: np.ndarray,
        memory: np.ndarray,
        phase: np.ndarray,
    ) -> None:
        """One chunk: its rebased times and durations, and which events are `[memory]` events
        and which phase ranges (the CPU-side ranges only: on CUDA traces Kineto repeats each
        record_function range on the GPU timeline, `gpu_user_annotation`, at GPU times)."""
        idx = np.flatnonzero(phase)
        self.phases += [
            (events[i].name, t, t + d)
            for i, t, d in zip(idx.tolist(), ts[idx].tolist(), dur[idx].tolist(), strict=True)
        ]
        idx = np.flatnonzero(memory)
        # One comprehension over the [memory] events only (a third of a trace's events can be
        # [memory] events), then the bounds as array operations: a Python call per event shows.
        rows = [
            (t, a.total_allocated, a.nbytes or 0, a.device_type or 0,
             -1 if a.device_id is None else a.device_id)
            for i, t in zip(idx.tolist(), ts[idx].tolist(), strict=True)
            if (a := events[i].args) is not None and a.total_allocated is not None
        ]  # fmt: skip
        # float64 holds every kept value exactly (the bounds are below 2^53), and int64 would
        # overflow on a hostile size; msgspec decodes any integer, so even float64 can.
        try:
            cols = np.array(rows, np.float64).reshape(-1, 5).T
        except OverflowError:
            rows = [(r[0], *(max(-_HUGE, min(_HUGE, v)) for v in r[1:])) for r in rows]
            cols = np.array(rows, np.float64).reshape(-1, 5).T
        t, total, delta, dtype, did = cols
        ok = ~np.isnan(t)  # NaN: no time, or one beyond the trace's one-day span (timebase.py)
        for col in (total, delta):
            ok &= np.abs(col) <= MAX_MEMORY_BYTES
        ok &= (dtype >= 0) & (dtype < _MAX_DEVICE) & (did >= -1) & (did < _MAX_DEVICE)
        self.dropped += int(ok.size - ok.sum())
        self.ts.append(t[ok])
        for acc, col in zip((self.total, self.delta, self.dtype, self.did), cols[1:], strict=True):
            acc.append(col[ok].astype(np.int64))

    def finish(self, origin: float) -> MemoryEvents:
        def cat(parts: list[np.ndarray], dtype) -> np.ndarray:
            return np.concatenate(parts) if parts else np.empty(0, dtype)

        # One integer per (device type, id), ordered as the pairs: np.unique over a 2-column
        # array (axis=0) sorts row views, ten times slower.
        key = cat(self.dtype, np.int64) * _KEY_SPAN + cat(self.did, np.int64) + 1
        keys, inverse = np.unique(key, return_inverse=True)
        names = [device_name(int(k) // _KEY_SPAN, int(k) % _KEY_SPAN - 1) for k in keys]
        return MemoryEvents(
            ts=cat(self.ts, np.float64) - origin,
            total=cat(self.total, np.int64),
            delta=cat(self.delta, np.int64),
            device=[names[i] for i in inverse.ravel().tolist()],
            phases=sorted(
                ((n, s - origin, e - origin) for n, s, e in self.phases), key=lambda p: p[1]
            ),
            dropped=self.dropped,
        )


def downsample(t: np.ndarray, y: np.ndarray, points: int = TIMELINE_POINTS):
    """At most ~`points` samples of a step curve, keeping each block's minimum and maximum so
    peaks survive."""
    n = t.size
    if n <= points:
        return t, y
    k = math.ceil(n / max(1, points // 2))
    pad = (-n) % k
    yy = np.concatenate([y, np.full(pad, y[-1])]).reshape(-1, k)
    base = np.arange(yy.shape[0]) * k
    keep = np.unique(np.concatenate([base + yy.argmin(1), base + yy.argmax(1), [0, n - 1]]))
    keep = keep[keep < n]
    return t[keep], y[keep]


def _level(ts: np.ndarray, total: np.ndarray, delta: np.ndarray, at: float) -> int:
    """Total allocated just before time `at` (the first event's starting level when none is
    earlier)."""
    i = int(np.searchsorted(ts, at, side="left")) - 1
    if i >= 0:
        return int(total[i])
    return int(total[0] - delta[0])


def _steps(phases: list[tuple[str, float, float]]) -> list[dict[str, tuple[float, float]]]:
    """Group the phase ranges into steps: each `forward` opens one."""
    steps: list[dict[str, tuple[float, float]]] = []
    for name, s, e in phases:
        if name == "forward":
            steps.append({"forward": (s, e)})
        elif steps and name not in steps[-1]:
            steps[-1][name] = (s, e)
    return steps


def _device_summary(ev: MemoryEvents, mask: np.ndarray, steps: list[dict]) -> dict:
    order = np.argsort(ev.ts[mask], kind="stable")
    ts, total, delta = ev.ts[mask][order], ev.total[mask][order], ev.delta[mask][order]
    per_step = []
    for st in steps:
        base = _level(ts, total, delta, st["forward"][0])
        row: dict = {"start_level_bytes": base}
        for phase in MEMORY_PEAK_PHASES:
            if phase not in st:
                row[f"{phase}_peak_bytes"] = None
                continue
            s, e = st[phase]
            lo, hi = np.searchsorted(ts, s, "left"), np.searchsorted(ts, e, "right")
            peak = max(_level(ts, total, delta, s), int(total[lo:hi].max()) if hi > lo else 0)
            row[f"{phase}_peak_bytes"] = peak - base
        per_step.append(row)
    t, y = downsample(ts, total)
    out = {"events": int(ts.size)}
    for phase in MEMORY_PEAK_PHASES:
        vals = [r[f"{phase}_peak_bytes"] for r in per_step if r[f"{phase}_peak_bytes"] is not None]
        out[f"{phase}_peak_bytes"] = max(vals) if vals else None
    return {
        **out,
        "start_level_bytes": per_step[0]["start_level_bytes"] if per_step else None,
        "per_step": per_step,
        "timeline": {"t_us": t.tolist(), "allocated_bytes": y.tolist()},
    }


def memory_summary(ev: MemoryEvents | None, path: str) -> dict:
    """The rank's `memory` object (docs/reference/metrics.md §11): per device the phase peaks, per-step
    values and a downsampled timeline; `phases` (name, start_us, end_us); and warnings. A trace
    without `[memory]` events or without phase ranges gets null peaks and a warning."""
    phases = ev.phases if ev is not None else []
    out: dict = {
        "devices": [],
        "phases": [{"phase": n, "start_us": s, "end_us": e} for n, s, e in phases],
        "warnings": [],
    }
    if ev is not None and ev.dropped:
        out["warnings"].append(
            f"{path}: dropped {ev.dropped} [memory] event(s) with implausible values (a size over"
            f" {MAX_MEMORY_BYTES:,} bytes = 1 PiB, a device number out of range, args that do not"
            " decode, or no usable time) — not analysed"
        )
    if ev is None or ev.ts.size == 0:
        out["warnings"].append(
            f"{path}: no [memory] events (profile_memory off?) — dynamic memory left null"
        )
        return out
    steps = _steps(phases)
    if not steps:
        out["warnings"].append(
            f"{path}: no forward/backward/optimizer ranges — per-phase memory peaks left null; "
            "wrap the phases in torch.profiler.record_function('forward') etc."
        )
    devices = np.asarray(ev.device)
    for name in sorted(set(ev.device)):
        out["devices"].append({"device": name, **_device_summary(ev, devices == name, steps)})
    return out


STATIC_FIELDS = (
    "parameters_bytes",
    "gradients_bytes",
    "optimizer_state_bytes",
    "buffers_bytes",
    "ddp_buckets_bytes",
    "static_total_bytes",
    "fsdp_unsharded_peak_bytes",  # not static (FSDP's gathered blocks), but counted with them
)
DYNAMIC_FIELDS = tuple(f"{p}_peak_bytes" for p in MEMORY_PEAK_PHASES)


def breakdown_entries(entries: object) -> list[dict]:
    """run.json `metrics.memory_breakdown` as runs-JSON entries: the static fields copied, the
    dynamic ones null until `fill_dynamic` (absent or malformed input gives [])."""
    if not isinstance(entries, list):
        return []
    out = []
    for e in entries:
        if (
            isinstance(e, dict)
            and isinstance(e.get("rank"), int)
            and isinstance(e.get("device"), str)
        ):
            static = {
                k: e.get(k)
                if isinstance(e.get(k), int) and not isinstance(e.get(k), bool)
                else None
                for k in STATIC_FIELDS
            }
            out.append(
                {
                    "rank": e["rank"],
                    "device": e["device"],
                    **static,
                    **dict.fromkeys(DYNAMIC_FIELDS),
                }
            )
    return out


def fill_dynamic(entries: list[dict], ranks: list[dict]) -> list[str]:
    """Fill each entry's phase peaks from the trace rank summary of the same rank and device, in
    place. A run without static entries (recorded before the breakdown existed) gets one entry
    per traced rank and device, static fields null. Returns the memory warnings to report."""
    warnings: list[str] = []
    by_key = {}
    for r in ranks:
        mem = r.get("memory") or {}
        warnings += mem.get("warnings", [])
        for d in mem.get("devices", []):
            by_key[(r["rank"], d["device"])] = d
    if not entries:
        entries += [
            {
                "rank": rank,
                "device": dev,
                **dict.fromkeys(STATIC_FIELDS),
                **dict.fromkeys(DYNAMIC_FIELDS),
            }
            for rank, dev in sorted(by_key)
        ]
    for e in entries:
        d = by_key.get((e["rank"], e["device"]))
        if d is not None:
            e.update({k: d.get(k) for k in DYNAMIC_FIELDS})
    return warnings
