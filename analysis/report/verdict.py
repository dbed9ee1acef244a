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
from analysis.runs.family import SHARDED

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
    ranks (then the fastest), a ZeRO-1/FSDP2 group only when there is none (the family line
    compares those); the others stay in the tables."""
    cands = [g for g in groups if g.get("mode") != "single" and g.get("speedup_mean") is not None]
    plain = [g for g in cands if g.get("strategy") not in SHARDED]
    return max(plain or cands, key=lambda g: (g.get("world_size") or 0, g["speedup_mean"]),
               default=None)  # fmt: skip


def _mib_text(n: float) -> str:
    return f"{n / MIB:.2f} MiB" if abs(n) < 100 * MIB else f"{n / MIB:,.0f} MiB"


def _params_text(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:,.0f} M" if n >= 1e6 else f"{n:,}"


def _family(key: tuple, data: dict[str, Any], *, throughput: bool = True) -> list[dict]:
    """The family line of a workload (analysis.runs.family): what each sharded mode saves per
    rank against DDP and at what throughput (`throughput=False` when the group's throughput is
    known noise: the memory counts are exact either way), then the largest model each mode
    fits."""
    out: list[dict] = []
    for f in (e for e in data.get("family") or [] if workload_key(e) == key):
        clauses = []
        for m in f.get("members") or []:
            if m.get("saved_bytes") is None:
                continue
            verb = "saves" if m["saved_bytes"] >= 0 else "costs"
            text = f"{m['label']} {verb} {_mib_text(abs(m['saved_bytes']))} per rank"
            text += f" ({abs(m['saved_pct']):.0f}%)"
            if throughput and m.get("throughput_vs_ddp_pct") is not None:
                text += f" at {m['throughput_vs_ddp_pct']:.0f}% of DDP's throughput"
            clauses.append(text)
        if not clauses:
            continue
        where = f" ({f.get('backend')}, {f.get('world_size')} ranks)"
        out += [_seg(" "), _seg("; ".join(clauses) + where, "#family"), _seg(".")]
        fits = [c for c in f.get("capacity") or [] if c.get("max_params") is not None]
        if fits and f.get("budget_bytes"):
            sizes = ", ".join(f"{c['label']} {_params_text(c['max_params'])}" for c in fits)
            budget = f"{f['budget_bytes'] / 2**30:.1f} GiB per rank ({f.get('budget_source')})"
            out += [_seg(f" Largest model that fits in {budget}: "),
                    _seg(f"{sizes} parameters", "#family"), _seg(".")]  # fmt: skip
    return out


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


NOT_ENOUGH_QUIET = "not enough quiet steps: re-run with --repeat auto or on an idle machine"


def _figures(g: dict[str, Any]) -> list[dict]:
    """The speedup and efficiency: the median and 95% CI over the group's rounds when it has
    several (analysis.runs.rounds), else its one run's; "on quiet steps" when some of its runs
    (or their baselines) were measured while other processes ran and the figures left those
    steps out."""
    rounds = g.get("n_rounds") or 0
    quiet = (
        " on quiet steps" if g.get("busy_run_ids") and g.get("throughput_basis") == "quiet" else ""
    )
    if rounds < 2 or g.get("speedup_median") is None:
        eff = 100 * (g.get("scaling_efficiency_mean") or 0.0)
        return [_seg(f"{g['speedup_mean']:.2f}× over single device{quiet}", "#speedup"),
                _seg(" ("), _seg(f"{eff:.0f}% efficiency", "#speedup"), _seg(").")]  # fmt: skip
    sp = (g["speedup_median"], g["speedup_ci95_low"], g["speedup_ci95_high"])
    ef = [
        100 * (g.get(f"scaling_efficiency_{k}") or 0.0) for k in ("median", "ci95_low", "ci95_high")
    ]
    return [_seg(f"{sp[0]:.2f}× over single device{quiet}", "#speedup"),
            _seg(f" (95% CI {sp[1]:.2f}–{sp[2]:.2f}× over {rounds} rounds; "),
            _seg(f"{ef[0]:.0f}% efficiency, {ef[1]:.0f}–{ef[2]:.0f}%", "#speedup"), _seg(").")]  # fmt: skip


def _paragraph(g: dict[str, Any], data: dict[str, Any], runs: dict) -> list[dict]:
    head = _seg(f"{_name(g)}, {g.get('world_size')} ranks: ")
    if g.get("noisy_run_ids"):  # its figures are known noise: none of them is quoted
        mem_segs, mem = _memory(g, runs)
        family = _family(workload_key(g), data, throughput=False)
        return [head, _seg(NOT_ENOUGH_QUIET, "#speedup"), _seg("."), *mem_segs, *family,
                *_try(g, mem, data)]  # fmt: skip
    eff = 100 * (g.get("scaling_efficiency_mean") or 0.0)
    segs = [head, *_figures(g)]
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
    family = _family(workload_key(g), data)
    return segs + mem_segs + family + _projection(g, data, runs) + _try(g, mem, data)


def _caveats(groups: list[dict[str, Any]], runs: dict[str, dict]) -> list[str]:
    members = [runs[r] for g in groups for r in g.get("run_ids") or [] if r in runs]
    out = []
    busy = [r for r in members if is_busy(r.get("host_load"))]
    if busy:
        frac = THRESHOLDS["busy_other_cores_frac"]
        quiet = all(r.get("throughput_basis") == "quiet" for r in busy)
        what = ("their figures use only their quiet steps" if quiet
                else "re-run with --repeat auto or on an idle machine")  # fmt: skip
        out.append(f"busy machine: other processes used more than {frac:.0%} of the cores "
                   f"during {len(busy)} of {len(members)} runs ({what})")  # fmt: skip
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
