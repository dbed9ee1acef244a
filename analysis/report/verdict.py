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
from analysis.runs.familyview import FamilyEntry
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


def _mib_text(n: float) -> str:
    return f"{n / MIB:.2f} MiB" if abs(n) < 100 * MIB else f"{n / MIB:,.0f} MiB"


def _params_text(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:,.0f} M" if n >= 1e6 else f"{n:,}"


def _family(family: list[FamilyEntry], *, throughput: bool = True) -> list[dict]:
    """The family line of a workload (analysis.runs.family): what each sharded mode saves per
    rank against DDP and at what throughput (`throughput=False` when the group's throughput is
    known noise: the memory counts are exact either way), then the largest model each mode
    fits."""
    out: list[dict] = []
    for f in family:
        clauses = []
        for m in (m for m in f.members if m.saved_bytes is not None):
            verb = "saves" if m.saved_bytes >= 0 else "costs"
            text = f"{m.label} {verb} {_mib_text(abs(m.saved_bytes))} per rank"
            text += f" ({abs(m.saved_pct or 0.0):.0f}%)"
            if throughput and m.throughput_vs_ddp_pct is not None:
                text += f" at {m.throughput_vs_ddp_pct:.0f}% of DDP's throughput"
            clauses.append(text)
        if not clauses:
            continue
        where = f" ({f.backend}, {f.world_size} ranks)"
        out += [_seg(" "), _seg("; ".join(clauses) + where, "#family"), _seg(".")]
        fits = [c for c in f.capacity if c.max_params is not None]
        if fits and f.budget_bytes:
            sizes = ", ".join(f"{c.label} {_params_text(c.max_params)}" for c in fits)
            budget = f"{f.budget_bytes / 2**30:.1f} GiB per rank ({f.budget_source})"
            out += [_seg(f" Largest model that fits in {budget}: "),
                    _seg(f"{sizes} parameters", "#family"), _seg(".")]  # fmt: skip
    return out


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


NOT_ENOUGH_QUIET = "not enough quiet steps: re-run with --repeat auto or on an idle machine"


def _figures(case: VerdictCase, g: GroupEntry) -> list[dict]:
    """The speedup and efficiency: the median and 95% CI over the group's rounds when it has
    several (analysis.runs.rounds), else its mean; "on quiet steps" when some of its runs (or
    their baselines) were measured while other processes ran and the figures left those steps
    out."""
    quiet = " on quiet steps" if case.on_quiet else ""
    if case.rounds < 2:
        return [_seg(f"{g.speedup_mean:.2f}× over single device{quiet}", "#speedup"),
                _seg(" ("), _seg(f"{case.efficiency_pct:.0f}% efficiency", "#speedup"),
                _seg(").")]  # fmt: skip
    sp = (g.speedup_median or 0.0, g.speedup_ci95_low or 0.0, g.speedup_ci95_high or 0.0)
    ef = [100 * (v or 0.0) for v in (g.scaling_efficiency_median, g.scaling_efficiency_ci95_low,
                                     g.scaling_efficiency_ci95_high)]  # fmt: skip
    return [_seg(f"{sp[0]:.2f}× over single device{quiet}", "#speedup"),
            _seg(f" (95% CI {sp[1]:.2f}–{sp[2]:.2f}× over {case.rounds} rounds; "),
            _seg(f"{ef[0]:.0f}% efficiency, {ef[1]:.0f}–{ef[2]:.0f}%", "#speedup"), _seg(").")]  # fmt: skip


def _paragraph(case: VerdictCase, g: GroupEntry) -> list[dict]:
    head = _seg(f"{_name(g)}, {g.world_size} ranks: ")
    if case.noisy:  # its figures are known noise: none of them is quoted
        return [head, _seg(NOT_ENOUGH_QUIET, "#speedup"), _seg("."), *_memory(case),
                *_family(case.family, throughput=False), *_try(case)]  # fmt: skip
    segs = [head, *_figures(case, g)]
    if g.comm_pct_mean is not None:
        segs += [_seg(" Communication "), _seg(f"{g.comm_pct_mean:.0f}% of the step", "#communication")]  # fmt: skip
        if g.exposed_comm_pct_mean is not None:
            segs += [_seg(", "), _seg(f"{g.exposed_comm_pct_mean:.0f}% exposed", "#communication")]  # fmt: skip
        segs.append(_seg("."))
    return (segs + _split(case) + _memory(case) + _family(case.family)
            + _projection(case.projected) + _try(case))  # fmt: skip


def _caveats(c: Caveats) -> list[str]:
    out = []
    if c.busy:
        frac = THRESHOLDS["busy_other_cores_frac"]
        what = ("their figures use only their quiet steps" if c.busy_quiet
                else "re-run with --repeat auto or on an idle machine")  # fmt: skip
        out.append(f"busy machine: other processes used more than {frac:.0%} of the cores "
                   f"during {c.busy} of {c.runs} runs ({what})")  # fmt: skip
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
