"""The verdict at the top of the report: per same-workload group, what DDP bought, where the
time went and what to try first, each number linked to the section whose table holds it.

Every clause reads a number the runs JSON already holds and a table shows (group speedup,
efficiency, comm and exposed-comm shares, the efficiency-loss split, the memory breakdown's
static difference, the projection's predictions and replays, the tuner's best arm); nothing is
computed a second time. A paragraph is a list of segments {text, href}; the template links those
with an href. Caveats (busy machine, few steps, superlinear efficiency) close the block.
"""

from __future__ import annotations

from typing import Any

from analysis.project.bands import band_text
from analysis.report.findings import NAMES, THRESHOLDS, is_busy
from analysis.report.loss import PART_NAMES, largest_part
from analysis.report.memory_section import static_difference
from analysis.report.projection import efficiency_text, predictions
from analysis.runs.compare import is_measured, workload_key

__all__ = ["VERDICT_RANKS", "verdict"]

VERDICT_RANKS = 8  # the projection the verdict quotes
MIB = 2**20


def _seg(text: str, href: str | None = None, *, code: bool = False) -> dict[str, Any]:
    """A piece of a paragraph: linked when `href`, a command or flag (kept on one line) when `code`."""
    return {"text": text, "href": href, "code": code}


def _name(g: dict[str, Any]) -> str:
    mode = NAMES.get(g.get("mode"), str(g.get("mode")))
    backend = g.get("backend")
    return f"{mode} ({backend})" if backend not in (None, "none", "dp") else mode


def _pick(groups: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The group a workload's paragraph is about: the DDP/DP group with a speedup and the most
    ranks (then the fastest); the others stay in the tables."""
    cands = [g for g in groups if g.get("mode") != "single" and g.get("speedup_mean") is not None]
    return max(cands, key=lambda g: (g.get("world_size") or 0, g["speedup_mean"]), default=None)


def _memory(g: dict[str, Any], runs: dict[str, dict]) -> tuple[list[dict], dict | None]:
    run = runs.get((g.get("run_ids") or [""])[0])
    single = runs.get((run or {}).get("baseline_run_id"))
    d = static_difference(run, single) if run and single else None
    if d is None or abs(d["diff_bytes"]) < 0.01 * d["ref"]:
        return [], d
    why = " (DDP's buckets)" if d["cause"] == "ddp_buckets_bytes" else ""
    return [_seg(" Memory "), _seg(f"{d['diff_bytes'] / MIB:+.2f} MiB per rank", "#memory"),
            _seg(f"{why}.")], d  # fmt: skip


def _projection(g: dict[str, Any], data: dict[str, Any], runs: dict) -> list[dict]:
    mine = set(g.get("run_ids") or [])
    key = workload_key(runs[next(iter(mine))]) if mine & runs.keys() else None
    for p in data.get("projections") or []:
        base = runs.get(p.get("run_id"))
        replays = [r for r in p.get("replays") or [] if r.get("run_id") in mine]
        if not replays and (base is None or workload_key(base) != key):
            continue
        at = next((x for x in predictions(p) if x["ranks"] == VERDICT_RANKS), None)
        if at is None:
            continue
        inputs = p.get("inputs") or {}
        # The link between nodes only matters past one node's ranks.
        across = VERDICT_RANKS > (inputs.get("gpus_per_node") or VERDICT_RANKS)
        gbps = inputs.get("inter_node_gbps") if across else None
        out = [_seg(f" Projected at {VERDICT_RANKS} ranks" + (f" over {gbps:g} Gb/s"
                    if gbps else "") + ": "),
               _seg(f"{band_text(at['speedup'], at['speedup_low'], at['speedup_high'], '{:.1f}', '×')}"
                    f" ({efficiency_text(at)})", "#projection")]  # fmt: skip
        if replays and isinstance(replays[0].get("error_pct"), int | float):
            out.append(_seg(f" (replay error {replays[0]['error_pct']:+.0f}%)", "#projection"))
        return [*out, _seg(".")]
    return []


def _try(g: dict[str, Any], mem: dict | None, data: dict[str, Any]) -> list[dict]:
    """What to try, in the form the group's runs can use (the runs JSON's `advice`: a script
    run gets the line of code to add, never a make target that cannot run its script)."""
    tips: list[list[dict]] = []
    advice = g.get("advice") or {}
    if mem and mem["cause"] == "ddp_buckets_bytes" and mem["diff_bytes"] > 0:
        tips.append([_seg(advice.get("bucket_view", "--gradient-as-bucket-view"), code=True),
                     _seg(f" (−{mem['cause_bytes'] / MIB:.2f} MiB)", "#memory")])  # fmt: skip
    best = next((t.get("best") for t in data.get("tunes") or [] if t.get("best")), None)
    if best and best.get("speedup_vs_baseline") and not g.get("script"):
        sig = "significant" if best.get("significant") else "not significant"
        tips.append([_seg(str(best.get("name")), code=True),
                     _seg(f" (tune-ddp: {best['speedup_vs_baseline']:.2f}×, {sig})", "#tuning")])  # fmt: skip
    elif g.get("mode") == "ddp":
        tips.append([_seg(advice.get("tune", "make tune-ddp"), code=True),
                     _seg(advice.get("tune_note", " (bucket sizes, no_sync)"))])  # fmt: skip
    if not tips:
        return []
    out = [_seg(" Try: ")]
    for i, tip in enumerate(tips):
        out += ([_seg("; ")] if i else []) + tip
    return [*out, _seg(".")]


def _paragraph(g: dict[str, Any], data: dict[str, Any], runs: dict) -> list[dict]:
    eff = 100 * (g.get("scaling_efficiency_mean") or 0.0)
    segs = [_seg(f"{_name(g)}, {g.get('world_size')} ranks: "),
            _seg(f"{g['speedup_mean']:.2f}× over single device", "#speedup"),
            _seg(" ("), _seg(f"{eff:.0f}% efficiency", "#speedup"), _seg(").")]  # fmt: skip
    if g.get("comm_pct_mean") is not None:
        segs += [_seg(" Communication "), _seg(f"{g['comm_pct_mean']:.0f}% of the step", "#communication")]  # fmt: skip
        if g.get("exposed_comm_pct_mean") is not None:
            segs += [_seg(", "), _seg(f"{g['exposed_comm_pct_mean']:.0f}% exposed", "#communication")]  # fmt: skip
        segs.append(_seg("."))
    parts = g.get("efficiency_loss_pts")
    top = largest_part(parts) if parts else None
    if top and eff < 100:
        segs += [_seg(" Largest loss: "),
                 _seg(f"{PART_NAMES[top[0]]}, {top[1]:.1f} of {100 - eff:.1f} points", "#efficiency"),
                 _seg(".")]  # fmt: skip
    elif parts:  # above linear: name what gained the points (and the largest loss left)
        gain = min((kv for kv in parts.items() if kv[1] is not None), key=lambda kv: kv[1])
        segs += [_seg(" Above linear: "),
                 _seg(f"{PART_NAMES[gain[0]]} {-gain[1]:+.1f} points", "#efficiency")]  # fmt: skip
        if top:
            segs += [_seg("; largest loss "),
                     _seg(f"{PART_NAMES[top[0]]}, {top[1]:.1f} points", "#efficiency")]  # fmt: skip
        segs.append(_seg("."))
    mem_segs, mem = _memory(g, runs)
    return segs + mem_segs + _projection(g, data, runs) + _try(g, mem, data)


def _caveats(groups: list[dict[str, Any]], runs: dict[str, dict]) -> list[str]:
    members = [runs[r] for g in groups for r in g.get("run_ids") or [] if r in runs]
    out = []
    busy = [r for r in members if is_busy(r.get("host_load"))]
    if busy:
        frac = THRESHOLDS["busy_other_cores_frac"]
        out.append(f"busy machine: other processes used more than {frac:.0%} of the cores "
                   f"during {len(busy)} of {len(members)} runs (re-measure on an idle machine)")  # fmt: skip
    few = [r for r in members if (r.get("measured_steps") or 0) < THRESHOLDS["few_measured_steps"]]
    if few:
        how = (few[0].get("advice") or {}).get("more_steps", "raise --max-steps")
        out.append(f"few steps: {len(few)} runs measured fewer than "
                   f"{THRESHOLDS['few_measured_steps']} unprofiled steps ({how})")  # fmt: skip
    out += _unstable_split(groups)
    # A 1-rank group has nothing to scale (its ratio is DDP's own cost and noise): not judged.
    sup = [g for g in groups if (g.get("world_size") or 1) > 1
           and (g.get("scaling_efficiency_mean") or 0) > THRESHOLDS["efficiency_superlinear"]]  # fmt: skip
    if sup:
        out.append(f"superlinear efficiency (above {THRESHOLDS['efficiency_superlinear']:.0%}): "
                   "usually a slowed single-device baseline (oversubscribed threads, a busy "
                   "machine), not a real gain; re-measure")  # fmt: skip
    return out


def _unstable_split(groups: list[dict[str, Any]]) -> list[str]:
    limit = THRESHOLDS["split_part_max_pts"]
    wild = {name for g in groups for name, v in (g.get("efficiency_loss_pts") or {}).items()
            if v is not None and abs(v) > limit}  # fmt: skip
    if not wild:
        return []
    names = ", ".join(text for name, text in PART_NAMES.items() if name in wild)
    return [f"unstable efficiency split: {names} beyond ±{limit:.0f} points, so the runs it "
            "compares ran under different conditions (a busy machine, a cold start); re-measure"]  # fmt: skip


def _workload_name(g: dict[str, Any]) -> str:
    """The workload a paragraph is about: its caption (runs JSON `workload_label`), then the
    rest of the same-workload key that tells it apart (batch, device type, OS)."""
    label = g.get("workload_label") or f"{g.get('model')}/{g.get('dataset')}"
    batch = [] if g.get("script") else [f"batch {g.get('fixed_batch')}"]
    return f"{label} ({', '.join([*batch, str(g.get('device_type')), str(g.get('os'))])})"


def verdict(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per same-workload group: {workload, segments, caveats}; a workload with no
    parallel group gets a segment saying what to run."""
    runs = {r["run_id"]: r for r in data.get("runs", []) if is_measured(r)}
    by_workload: dict[tuple, list[dict]] = {}
    for g in data.get("groups", []):
        by_workload.setdefault(workload_key(g), []).append(g)
    out = []
    for groups in by_workload.values():
        g = _pick(groups)
        pair = (groups[0].get("advice") or {}).get("pair", "run `make profile-all`")
        segs = (
            _paragraph(g, data, runs)
            if g
            else [_seg(f"No parallel run with a single-device baseline: {pair}.")]
        )
        name = _workload_name(groups[0])
        out.append({"workload": name, "segments": segs, "caveats": _caveats(groups, runs)})
    return out
