"""The verdict at the top of the report: per same-workload group, what DDP bought, where the
time went and what to try first, each number linked to the section whose table holds it.

Every clause words a number analysis.runs.verdict decided (group speedup, efficiency, comm and
exposed-comm shares, the efficiency-loss split, the static-memory difference, the projection and
its replay, the tuner's best arm); nothing is computed here. A paragraph is a list of segments
{text, href, code}; the template links those with an href. Caveats close the block.
"""

from __future__ import annotations

from typing import Any

from analysis.project.bands import band_text
from analysis.report.findings import NAMES
from analysis.report.loss import PART_NAMES
from analysis.report.projection import efficiency_text
from analysis.runs.groups import GroupEntry
from analysis.runs.rules import THRESHOLDS
from analysis.runs.runsjson import RunsJson, read_runs_json
from analysis.runs.verdict import VERDICT_RANKS, Caveats, Projected, VerdictCase, verdict_cases

__all__ = ["VERDICT_RANKS", "verdict"]

MIB = 2**20


def _seg(text: str, href: str | None = None, *, code: bool = False) -> dict[str, Any]:
    """A piece of a paragraph: linked when `href`, a command or flag (kept on one line) when `code`."""
    return {"text": text, "href": href, "code": code}


def _name(g: GroupEntry) -> str:
    mode = NAMES.get(g.mode or "", str(g.mode))
    return f"{mode} ({g.backend})" if g.backend not in (None, "none", "dp") else mode


def _memory(case: VerdictCase) -> list[dict]:
    d = case.memory
    if d is None or not case.memory_shown:
        return []
    why = " (DDP's buckets)" if d.cause == "ddp_buckets_bytes" else ""
    return [_seg(" Memory "), _seg(f"{d.diff_bytes / MIB:+.2f} MiB per rank", "#memory"),
            _seg(f"{why}.")]  # fmt: skip


def _projection(p: Projected | None) -> list[dict]:
    if p is None:
        return []
    at, gbps = p.at, p.inter_node_gbps
    band = band_text(at.speedup, at.speedup_low, at.speedup_high, "{:.1f}", "×")
    out = [_seg(f" Projected at {VERDICT_RANKS} ranks" + (f" over {gbps:g} Gb/s" if gbps else "")
                + ": "),
           _seg(f"{band} ({efficiency_text(at)})", "#projection")]  # fmt: skip
    if p.replay is not None:
        out.append(_seg(f" (replay error {p.replay.error_pct:+.0f}%)", "#projection"))
    return [*out, _seg(".")]


def _try(case: VerdictCase) -> list[dict]:
    """What to try, in the form the group's runs can use (the runs JSON's `advice`: a script
    run gets the line of code to add, never a make target that cannot run its script)."""
    tips: list[list[dict]] = []
    advice, best = case.advice, case.best_tune
    if case.bucket_tip and case.memory is not None:
        tips.append([_seg(advice.bucket_view, code=True),
                     _seg(f" (−{case.memory.cause_bytes / MIB:.2f} MiB)", "#memory")])  # fmt: skip
    if best is not None:
        sig = "significant" if best.significant else "not significant"
        tips.append([_seg(str(best.name), code=True),
                     _seg(f" (tune-ddp: {best.speedup_vs_baseline:.2f}×, {sig})", "#tuning")])  # fmt: skip
    elif case.tune_tip:
        tips.append([_seg(advice.tune, code=True), _seg(advice.tune_note)])
    if not tips:
        return []
    out = [_seg(" Try: ")]
    for i, tip in enumerate(tips):
        out += ([_seg("; ")] if i else []) + tip
    return [*out, _seg(".")]


def _split(case: VerdictCase) -> list[dict]:
    top, gain = case.largest, case.gain
    if case.name_largest and top:
        return [_seg(" Largest loss: "),
                _seg(f"{PART_NAMES[top[0]]}, {top[1]:.1f} of {case.lost_pts:.1f} points", "#efficiency"),
                _seg(".")]  # fmt: skip
    if gain is None:
        return []
    # above linear: name what gained the points (and the largest loss left)
    segs = [_seg(" Above linear: "),
            _seg(f"{PART_NAMES[gain[0]]} {-gain[1]:+.1f} points", "#efficiency")]  # fmt: skip
    if top:
        segs += [_seg("; largest loss "),
                 _seg(f"{PART_NAMES[top[0]]}, {top[1]:.1f} points", "#efficiency")]  # fmt: skip
    return [*segs, _seg(".")]


def _paragraph(case: VerdictCase, g: GroupEntry) -> list[dict]:
    segs = [_seg(f"{_name(g)}, {g.world_size} ranks: "),
            _seg(f"{g.speedup_mean:.2f}× over single device", "#speedup"),
            _seg(" ("), _seg(f"{case.efficiency_pct:.0f}% efficiency", "#speedup"), _seg(").")]  # fmt: skip
    if g.comm_pct_mean is not None:
        segs += [_seg(" Communication "), _seg(f"{g.comm_pct_mean:.0f}% of the step", "#communication")]  # fmt: skip
        if g.exposed_comm_pct_mean is not None:
            segs += [_seg(", "), _seg(f"{g.exposed_comm_pct_mean:.0f}% exposed", "#communication")]  # fmt: skip
        segs.append(_seg("."))
    return segs + _split(case) + _memory(case) + _projection(case.projected) + _try(case)


def _caveats(c: Caveats) -> list[str]:
    out = []
    if c.busy:
        frac = THRESHOLDS["busy_other_cores_frac"]
        out.append(f"busy machine: other processes used more than {frac:.0%} of the cores "
                   f"during {c.busy} of {c.runs} runs (re-measure on an idle machine)")  # fmt: skip
    if c.few:
        out.append(f"few steps: {c.few} runs measured fewer than "
                   f"{THRESHOLDS['few_measured_steps']} unprofiled steps ({c.more_steps})")  # fmt: skip
    if c.wild_parts:
        names = ", ".join(PART_NAMES[p] for p in c.wild_parts)
        out.append(f"unstable efficiency split: {names} beyond "
                   f"±{THRESHOLDS['split_part_max_pts']:.0f} points, so the runs it compares ran "
                   "under different conditions (a busy machine, a cold start); re-measure")  # fmt: skip
    if c.superlinear:
        out.append(f"superlinear efficiency (above {THRESHOLDS['efficiency_superlinear']:.0%}): "
                   "usually a slowed single-device baseline (oversubscribed threads, a busy "
                   "machine), not a real gain; re-measure")  # fmt: skip
    return out


def _workload_name(g: GroupEntry) -> str:
    """The workload a paragraph is about: its caption (runs JSON `workload_label`), then the
    rest of the same-workload key that tells it apart (batch, device type, OS)."""
    label = g.workload_label or f"{g.model}/{g.dataset}"
    batch = [] if g.script else [f"batch {g.fixed_batch}"]
    return f"{label} ({', '.join([*batch, str(g.device_type), str(g.os)])})"


def verdict(data: dict[str, Any] | RunsJson) -> list[dict[str, Any]]:
    """One entry per same-workload group: {workload, segments, caveats}; a workload with no
    parallel group gets a segment saying what to run."""
    out = []
    for case in verdict_cases(read_runs_json(data)):
        g = case.group
        segs = (
            _paragraph(case, g)
            if g
            else [_seg(f"No parallel run with a single-device baseline: {case.advice.pair}.")]
        )
        out.append({"workload": _workload_name(case.first), "segments": segs,
                    "caveats": _caveats(case.caveats)})  # fmt: skip
    return out
