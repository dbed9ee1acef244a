"""The projection's checks (definitions: docs/reference/metrics.md §10): a run projected at a
measured run's world size against its measured step (`replay`, `measured[]`, with the band and
whether the step lies inside it), and a DDP run replayed from its own traced calls
(`replay_traced`, the arithmetic alone)."""

from __future__ import annotations

from analysis.project.bands import band_fields
from analysis.project.model import ProjectionInputs
from analysis.project.step import predict_step

__all__ = ["GLOO_THREADS", "check", "check_entry", "replay_traced"]

GLOO_THREADS = 2
"""Collectives gloo runs at once: ProcessGroupGloo's worker threads (torch's default, 2)."""


def check(run: ProjectionInputs, target: ProjectionInputs, kw: dict, base: dict,
           ends: dict) -> dict:  # fmt: skip
    """Projection of `run` at `target`'s world size vs `target`'s measured unprofiled step time,
    with the prediction's band and whether the measured step lies inside it (`in_band`);
    `measured_scaling_efficiency` divides by the same projected n = 1 throughput as predictions."""
    n = target.world_size
    p = predict_step(run, n, **kw)
    band = band_fields(run, n, kw, ends)
    lo, hi = band["step_time_s_low"], band["step_time_s_high"]
    note = None
    if target is run and n == 1:
        note = (
            "single-device run: no communication to model, so the replay is exact by construction"
        )
    if abs(p["per_device_batch"] - target.per_device_batch) > 1e-9:
        note = f"per-device batch differs ({p['per_device_batch']:g} vs {target.per_device_batch})"
    return check_entry(target.run_id, n, target.step_time_s, target.global_batch, p, (lo, hi),
                       target.traced_exposed_comm_s, base, note)  # fmt: skip


def check_entry(run_id: str, n: int, measured_s: float, global_batch: float, predicted: dict,
                band: tuple[float, float], traced_exposed_comm_s: float | None, base: dict,
                note: str | None = None) -> dict:  # fmt: skip
    """One check's fields: the projection at n (`predicted`, with its step `band`) against the
    run `run_id` measured at n (`measured_s` per step of `global_batch` samples), its error and
    whether it lies in the band; `base`: the projected 1-rank prediction the measured efficiency
    divides by."""
    lo, hi = band
    measured_sps = global_batch / measured_s
    return {
        "run_id": run_id,
        "ranks": n,
        "measured_step_time_s": measured_s,
        "predicted_step_time_s": predicted["step_time_s"],
        "predicted_step_time_s_low": lo,
        "predicted_step_time_s_high": hi,
        "in_band": bool(lo <= measured_s <= hi),
        "error_pct": 100 * (predicted["step_time_s"] - measured_s) / measured_s,
        "predicted_exposed_comm_s": predicted["exposed_comm_s"],
        "traced_exposed_comm_s": traced_exposed_comm_s,
        "measured_samples_per_s": measured_sps,
        "measured_scaling_efficiency": measured_sps / base["samples_per_s"] / n,
        "note": note,
    }


def replay_traced(run: ProjectionInputs, kw: dict) -> dict | None:
    """A DDP RUN at its own n with its own traced per-bucket all-reduce and broadcast times, the
    time each bucket started before the end of the backward compute that precedes the
    communication, and the finalize after the last one (analysis.project.traced.bucket_calls,
    scaled like the exposed share to the unprofiled steps) in place of the comm model, the
    byte-proportional ready times and a finalize of 0: its error measures the projection's
    arithmetic alone (queueing, exposure past the backward compute, means over steps). Measured
    in situ, calls that ran at once hold their sharing of the host, so they take as many lanes
    as the backend runs at once (GLOO_THREADS on gloo, 1 on NCCL); the comm model's isolated
    times queue on one stream, the same work. None for single-device runs and runs without
    traced buckets."""
    calls = run.traced_calls
    if run.mode != "ddp" or run.world_size < 2 or not calls:
        return None
    scale = run.step_time_s / calls["step_time_us"]  # traced µs -> unprofiled s
    groups = run.buffer_groups_bytes
    bcast = [t * scale for t in calls["broadcast_us"]] if groups else []
    finalize = calls["finalize_us"] * scale
    pre = run.backward_compute_s - finalize  # the backward compute before the communication
    leads = calls["bucket_lead_us"]
    ready = None if None in leads else [max(0.0, pre - t * scale) for t in leads]
    # In-situ times of calls that ran at once already hold their sharing, so they overlap as the
    # run ran them: gloo's 2 worker threads (ProcessGroupGloo's default), one NCCL stream.
    lanes = GLOO_THREADS if run.backend == "gloo" else 1
    traced = {"bucket_s": [t * scale for t in calls["bucket_us"]], "broadcast_s": bcast,
              "ready_s": ready, "finalize_s": finalize, "lanes": lanes}  # fmt: skip
    p = predict_step(run, run.world_size, **{**kw, "traced": traced})
    return {
        "run_id": run.run_id,
        "ranks": run.world_size,
        "measured_step_time_s": run.step_time_s,
        "predicted_step_time_s": p["step_time_s"],
        "error_pct": 100 * (p["step_time_s"] - run.step_time_s) / run.step_time_s,
        "predicted_exposed_comm_s": p["exposed_comm_s"],
        "traced_exposed_comm_s": run.traced_exposed_comm_s,
        "traced_steps": calls["steps"],
        "bucket_s": traced["bucket_s"],
        "bucket_ready_s": ready,
        "lanes": lanes,
        "finalize_s": finalize,
        "bucket_start_s": [None if t is None else t * scale for t in calls["bucket_start_us"]],
        "bucket_gaps_ms": [None if g is None else g * scale * 1e3 for g in calls["bucket_gaps_us"]],
        "broadcast_s": bcast,
    }
