"""The projection's arithmetic: DDP's bucket assignment, the hierarchical all-reduce time, the
bucket/backward overlap and the straggler term (definitions: docs/reference/metrics.md §10). Pure
functions over numbers; analysis/project/inputs.py reads a run's measurements into the record
they take (ProjectionInputs) and analysis/project/projection.py feeds it to them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from analysis.project.comm import collective_time_us, ring_steps
from analysis.trace.collectives import bus_factor
from profiler.runfolder.errors import InputError

__all__ = [
    "FIRST_BUCKET_BYTES",
    "ProjectionInputs",
    "arrival_skew_s",
    "INTER_NODE_ALPHA_US",
    "INTER_NODE_PRESETS",
    "hierarchical_us",
    "assumptions",
    "compute_phases",
    "ddp_buckets",
    "expected_max",
    "parse_inter_node",
    "straggler_s",
]

INTER_NODE_PRESETS = {"25": 25.0, "100": 100.0, "200": 200.0, "400": 400.0}  # Gb/s per node
INTER_NODE_ALPHA_US = 10.0  # per ring step between nodes: NIC + switch + software, an assumption
FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


@dataclass(kw_only=True)
class ProjectionInputs:
    """A training run as the projection reads it (`load_training`); times in seconds per step."""

    run_id: str
    path: str
    mode: str
    """single | ddp."""
    backend: str | None
    world_size: int
    model: str | None
    dataset: str | None
    scaling: str
    per_device_batch: int
    global_batch: int
    comm_hook: str
    threads_per_rank: int | None
    steps_used: int
    """Distinct steps the means are taken over (the rule's measured steps)."""
    step_time_s: float
    """Mean step time over those steps of every rank."""
    phases_s: dict[str, float]
    """Mean of each of STEP_PHASES over those steps."""
    other_s: float
    """step − Σ phases (≥ 0): the loop's remainder."""
    step_samples_s: np.ndarray
    """Every rank's step times over those steps (minus the traced exposed share for DDP)."""
    buckets_bytes: list[int]
    bucket_source: str
    buffer_groups_bytes: list[int]
    backward_compute_s: float
    """backward_s, minus a DDP run's traced exposed communication."""
    traced_exposed_comm_s: float | None = None
    """A DDP run's traced exposed share × its measured step (analysis.project.traced)."""
    exposed_share: float | None = None
    """That share: the last-arriving rank's exposed comm ÷ the traced step."""
    traced_calls: dict | None = None
    """The traces' per-bucket calls (analysis.project.traced.bucket_calls, traced µs)."""
    ddp1: ProjectionInputs | None = None
    """For a single-device run: a 1-rank DDP run of its workload, whose compute (DDP's own
    per-step cost included) the projection takes at n ≥ 2 (`--workload-runs`)."""
    compute_s: float = 0.0
    """step − backward + backward compute."""
    warnings: list[str] = field(default_factory=list)


def ddp_buckets(
    param_bytes: list[int], bucket_cap_mb: float, first_bucket_bytes: int = FIRST_BUCKET_BYTES
) -> list[int]:
    """Bucket sizes (bytes) in gradient-ready order, as DDP's reducer assigns them.

    Gradients become ready in reverse parameter order; a bucket closes once it holds at least its
    limit (the parameter that crosses the limit stays in it); the first bucket's limit is
    `first_bucket_bytes` (run.json `config.ddp.first_bucket_bytes`: 1 MiB in older torch, and
    `bucket_cap_mb` itself in a torch whose DDP was given bucket_cap_mb explicitly, as dpscope
    does), later ones `bucket_cap_mb` MiB (torch.distributed._compute_bucket_assignment_by_size).
    """
    cap = int(bucket_cap_mb * 1024 * 1024)
    limits = iter([first_bucket_bytes])
    buckets, size = [], 0
    limit = next(limits, cap)
    for nbytes in reversed(param_bytes):
        size += int(nbytes)
        if size >= limit:
            buckets.append(size)
            size, limit = 0, next(limits, cap)
    if size:
        buckets.append(size)
    return buckets


def expected_max(samples: np.ndarray, n: int) -> float:
    """E[max of n independent draws] from the empirical distribution of `samples` (exact:
    Σ x₍ₖ₎·((k/m)ⁿ − ((k−1)/m)ⁿ) over the sorted values)."""
    x = np.sort(np.asarray(samples, dtype=float))
    k = np.arange(1, x.size + 1) / x.size
    return float(np.sum(x * (k**n - (k - 1 / x.size) ** n)))


def hierarchical_us(nbytes: float, n: int, gpn: int, intra: dict, inter_gbps: float) -> float:
    """Hierarchical collective (`intra["collective"]`, all_reduce for the gradient buckets): ring
    inside a node (α–β of the comm run) plus, past one node, ring between nodes where each node
    moves all `nbytes` through its link (steps and bus factor of that collective)."""
    if n <= gpn:
        return collective_time_us(intra, nbytes, n)
    nodes = math.ceil(n / gpn)
    name = intra["collective"]
    factor = bus_factor(name, nodes) or 1.0
    inter = ring_steps(name, nodes) * INTER_NODE_ALPHA_US + factor * nbytes / (inter_gbps / 8 * 1e3)
    return collective_time_us(intra, nbytes, gpn) + inter


def parse_inter_node(value: str) -> float:
    text = str(value).strip().lower().removesuffix("gbps").removesuffix("gb/s")
    text = INTER_NODE_PRESETS.get(text, text)
    try:
        gbps = float(text)
    except ValueError:
        gbps = -1.0
    if not gbps > 0:
        raise InputError(
            "--inter-node",
            f"{value!r} is not a preset or Gb/s",
            "use 25, 100, 200, 400 or a number",
        )
    return gbps


def assumptions(
    scaling: str,
    run: ProjectionInputs,
    gpn: int,
    inter_gbps: float,
    by_batch: dict,
    bandwidth: str,
    *,
    idle: bool = False,
    host: str = "",
) -> list[str]:
    """The projection's assumptions in words (printed and stored with every projection)."""
    out = [
        f"{scaling} scaling: per-device batch "
        + ("global ÷ n" if scaling == "strong" else f"stays {run.per_device_batch}"),
        "data, forward and backward time linear in the per-device batch; optimizer and loop "
        "remainder constant"
        + (
            f" (measured runs at batch {sorted(by_batch)} used where they match)"
            if by_batch
            else ""
        ),
        "gradients become ready during backward in proportion to their bytes (reverse layer order)",
        "buckets all-reduced one after another on one stream (DDP's reducer)",
        f"ring all-reduce α–β model from the comm run inside a node of {gpn} ranks; "
        + (
            "bus bandwidth per message size as benchmarked, from its mean times when it has them "
            "(busbw does not depend on n)"
            if bandwidth == "measured"
            else "one fitted bus bandwidth for every size"
        ),
        "DDP broadcasts the module's buffers at every forward (broadcast_buffers, torch's "
        "default): one broadcast per buffer dtype, nothing overlapping it",
        f"between nodes: ring over {inter_gbps:g} Gb/s per node, α = {INTER_NODE_ALPHA_US:g} µs "
        "per step; hierarchical (intra all-reduce + inter all-reduce of the whole bucket)",
        host,
        "the step waits for the slowest rank: E[max of n draws] of RUN's per-step compute, "
        "ranks independent",
    ]
    if idle:
        out.append(
            "each bucket and buffer broadcast pays the comm run's idle penalty (call after a gap − "
            "after none) at the compute gap before it, interpolated in gap and size, once per "
            "call whatever n"
        )
    return [a for a in out if a]


def arrival_skew_s(run: ProjectionInputs, n: int) -> float:
    """How long the other ranks have already waited, on average, when the last of n reaches a
    collective: E[max of n] − E[one draw] of RUN's per-step compute (0 at one rank or without
    samples). An early rank's transport is awake while it waits, so this much of a call's idle
    penalty is hidden (docs/reference/metrics.md §10, "Idle penalty")."""
    x = run.step_samples_s
    if x.size == 0 or n < 2:
        return 0.0
    return max(0.0, expected_max(x, n) - float(np.mean(x)))


def straggler_s(run: ProjectionInputs, n: int) -> float:
    """Extra step time from waiting for the slowest of n ranks: E[max of n] − E[max of RUN's n]
    of RUN's per-step compute (a DDP run's samples already carry its own ranks' max)."""
    x = run.step_samples_s
    if x.size == 0 or n <= run.world_size:
        return 0.0
    return max(0.0, expected_max(x, n) - expected_max(x, run.world_size))


def compute_phases(
    run: ProjectionInputs, batch: float, batch_runs: dict[int, ProjectionInputs], n: int = 1
) -> tuple[dict, str]:
    """Per-step compute phases at per-device `batch`: a measured run at that batch, else linear
    in the batch; at n ≥ 2 from `run.ddp1` when it has one (DDP's own per-step cost: its hooks,
    the copies into and out of the buckets, which a single-device run does not pay)."""
    other = batch_runs.get(int(batch)) if float(batch).is_integer() else None
    if other is not None and int(batch) != run.per_device_batch:
        ph = dict(other.phases_s, backward=other.backward_compute_s, other=other.other_s)
        return ph, f"measured ({other.run_id})"
    src = run.ddp1 if run.ddp1 is not None and n > 1 else run
    k = batch / src.per_device_batch
    ph = {
        "data": src.phases_s["data"] * k,
        "forward": src.phases_s["forward"] * k,
        "backward": src.backward_compute_s * k,
        "optimizer": src.phases_s["optimizer"],
        "other": src.other_s,
    }
    how = "measured" if k == 1 else "linear in batch"
    return ph, how if src is run else f"{how}, DDP at 1 rank ({src.run_id})"
