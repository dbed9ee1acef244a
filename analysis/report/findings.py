"""Plain-language findings: each one comes from a computed rule whose threshold is stated in its text.

Rules read only the runs JSON of `compare_runs`; they never guess. A rule that lacks its inputs
(no baseline, no traces, one device) says nothing rather than something vague.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Finding", "THRESHOLDS", "findings"]

# The thresholds, in one place so the text and the rule can't drift apart.
THRESHOLDS = {
    "efficiency_good": 0.80,  # scaling efficiency at or above this is good scaling
    "efficiency_poor": 0.50,  # below this the extra devices mostly wait
    "exposed_comm_pct": 10.0,  # exposed comm above this share of the step is worth tuning
    "memory_imbalance_pct": 10.0,  # max device over min device, in %
    "accuracy_drop_pp": 1.0,  # top-1 drop vs single, in percentage points
    "backend_ratio": 1.05,  # throughput ratio between backends below this is noise
}

NAMES = {"single": "Single", "dp": "DP", "ddp": "DDP"}


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One sentence for the user; `severity` is good | warn | bad | info; `rule` names the rule."""

    rule: str
    severity: str
    text: str
    run_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _name(run: dict[str, Any]) -> str:
    mode = NAMES.get(run.get("mode"), str(run.get("mode")))
    backend = run.get("backend")
    return f"{mode} ({backend.upper()})" if mode == "DDP" and backend else mode


def _scaling(run: dict[str, Any]) -> Finding | None:
    speedup, eff = run.get("speedup"), run.get("scaling_efficiency")
    if run.get("mode") == "single" or speedup is None or eff is None:
        return None
    t = THRESHOLDS
    verdict = (
        "good scaling"
        if eff >= t["efficiency_good"]
        else "poor scaling"
        if eff < t["efficiency_poor"]
        else "fair scaling"
    )
    text = (
        f"{_name(run)} on {run['world_size']} ranks reached {speedup:.2f}× vs single "
        f"({eff * 100:.0f}% efficiency: {verdict}; ≥ {t['efficiency_good'] * 100:.0f}% is good, "
        f"< {t['efficiency_poor'] * 100:.0f}% is poor)."
    )
    exposed = run.get("exposed_comm_pct")
    if exposed is not None:
        word = "allreduce" if run.get("mode") == "ddp" else "communication"
        text += f" {exposed:.0f}% of step time is exposed {word}"
        text += (
            f" (above the {t['exposed_comm_pct']:.0f}% threshold: try larger buckets, no_sync "
            "gradient accumulation or a faster backend)."
            if exposed > t["exposed_comm_pct"]
            else f" (within the {t['exposed_comm_pct']:.0f}% threshold)."
        )
    if speedup < 1:
        severity = "bad"
    else:
        severity = "good" if verdict == "good scaling" else "warn"
    return Finding(rule="scaling", severity=severity, text=text, run_ids=[run["run_id"]])


def _memory(run: dict[str, Any]) -> Finding | None:
    # GPU runs: what the caching allocator handed out; CPU runs: the process's peak RSS
    # (the same metric compare_runs used for the run's imbalance ratios).
    metric = run.get("memory_metric") or "peak_allocated_bytes"

    def _memory_value(m: dict[str, Any]) -> int | None:
        return m.get(metric)

    entries = [m for m in run.get("memory") or [] if _memory_value(m)]
    if len(entries) < 2:
        return None
    hi = max(entries, key=_memory_value)
    lo = min(entries, key=_memory_value)
    pct = (_memory_value(hi) / _memory_value(lo) - 1) * 100
    limit = THRESHOLDS["memory_imbalance_pct"]
    what = "peak RSS" if metric == "peak_rss_bytes" else "peak allocated"

    def where(m: dict[str, Any]) -> str:
        dev = m.get("device")
        return f"{dev}" if run.get("mode") == "dp" else f"rank {m.get('rank')} ({dev})"

    if pct < limit:
        text = (
            f"{_name(run)} on {run['world_size']} ranks: memory is balanced ({what} differs by "
            f"{pct:.0f}% between {'devices' if run.get('mode') == 'dp' else 'ranks'}, under the {limit:.0f}% threshold)."
        )
        return Finding(rule="memory", severity="good", text=text, run_ids=[run["run_id"]])
    text = (
        f"{_name(run)} holds {pct:.0f}% more memory on {where(hi)} than on {where(lo)} "
        f"({what}; imbalance threshold {limit:.0f}%)."
    )
    return Finding(rule="memory", severity="warn", text=text, run_ids=[run["run_id"]])


def _accuracy(groups: list[dict[str, Any]]) -> list[Finding]:
    out = []
    key = ("model", "dataset", "scaling", "os")
    singles = {tuple(g.get(k) for k in key): g for g in groups if g.get("mode") == "single"}
    limit = THRESHOLDS["accuracy_drop_pp"]
    for g in groups:
        base = singles.get(tuple(g.get(k) for k in key))
        if g.get("mode") == "single" or base is None:
            continue
        a, b = g.get("top1_pct_mean"), base.get("top1_pct_mean")
        if a is None or b is None:
            continue
        name = _name(g)
        if b - a > limit:
            text = (
                f"{name} on {g['world_size']} ranks lost accuracy vs single: top-1 {a:.1f}% vs "
                f"{b:.1f}% (a drop over {limit:.0f} pp): consider SyncBatchNorm / lr scaling."
            )
            out.append(Finding(rule="accuracy", severity="bad", text=text))
        else:
            text = (
                f"{name} on {g['world_size']} ranks held accuracy: top-1 {a:.1f}% vs {b:.1f}% "
                f"single (within {limit:.0f} pp)."
            )
            out.append(Finding(rule="accuracy", severity="good", text=text))
    return out


def _backends(groups: list[dict[str, Any]]) -> list[Finding]:
    out = []
    key = ("model", "dataset", "scaling", "world_size", "os")
    by_key: dict[tuple, dict[str, dict[str, Any]]] = {}
    for g in groups:
        if g.get("mode") == "ddp" and g.get("samples_per_s_mean"):
            by_key.setdefault(tuple(g.get(k) for k in key), {})[g["backend"]] = g
    for found in by_key.values():
        if {"nccl", "gloo"} <= found.keys():
            n, gl = found["nccl"]["samples_per_s_mean"], found["gloo"]["samples_per_s_mean"]
            fast, slow, ratio = ("NCCL", "GLOO", n / gl) if n >= gl else ("GLOO", "NCCL", gl / n)
            limit = THRESHOLDS["backend_ratio"]
            if ratio >= limit:
                text = f"Backends: {fast} {ratio:.1f}× faster than {slow} on the same run."
            else:
                text = f"Backends: NCCL and GLOO within {(limit - 1) * 100:.0f}% of each other."
            text += f" ({found['nccl']['model']}, {found['nccl']['world_size']} ranks, {found['nccl']['os']})"
            out.append(Finding(rule="backends", severity="info", text=text))
    return out


def _dp_vs_ddp(runs: list[dict[str, Any]]) -> list[Finding]:
    out = []
    ok = [r for r in runs if r.get("status") == "ok" and r.get("samples_per_s")]
    for dp in (r for r in ok if r.get("mode") == "dp"):
        for ddp in (r for r in ok if r.get("mode") == "ddp"):
            same = all(
                dp.get(k) == ddp.get(k) for k in ("model", "dataset", "world_size", "seed", "os")
            )
            if same:
                ratio = ddp["samples_per_s"] / dp["samples_per_s"]
                text = (
                    f"{_name(ddp)} ran at {ratio:.2f}× the throughput of DP on "
                    f"{dp['world_size']} devices."
                )
                out.append(
                    Finding(
                        rule="dp_vs_ddp",
                        severity="info",
                        text=text,
                        run_ids=[dp["run_id"], ddp["run_id"]],
                    )
                )
    return out


def _failures(data: dict[str, Any]) -> list[Finding]:
    out = []
    for r in data.get("runs", []):
        if r.get("status") != "ok":
            err = r.get("error")
            why = (err.get("message") if isinstance(err, dict) else err) or "no reason recorded"
            out.append(
                Finding(
                    rule="run_status",
                    severity="bad" if r.get("status") == "failed" else "info",
                    text=f"Run {r['run_id']} is {r.get('status')}: {why}",
                    run_ids=[r["run_id"]],
                )
            )
    for s in data.get("skipped", []):
        out.append(
            Finding(
                rule="run_status",
                severity="bad",
                text=f"Folder {s['path']} could not be read: {s['reason']}",
            )
        )
    return out


def findings(data: dict[str, Any]) -> list[Finding]:
    """All findings for the runs JSON, in reading order: status, scaling, memory, accuracy, backends."""
    runs = data.get("runs", [])
    ok = [r for r in runs if r.get("status") == "ok"]
    out = _failures(data)
    out += [f for f in map(_scaling, ok) if f]
    out += [f for f in map(_memory, ok) if f]
    out += _accuracy(data.get("groups", []))
    out += _backends(data.get("groups", []))
    out += _dp_vs_ddp(runs)
    return out
