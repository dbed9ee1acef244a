"""A group's figures over its rounds: median and 95% bootstrap interval of the speedup, the
efficiency and the throughput, which steps they stand on, and which of its runs are noise
(docs/reference/metrics.md, "Rounds and confidence intervals").

A group's runs are its rounds (`--repeat`) or its seeds: each run's speedup is paired with its
own round's single run (analysis.runs.compare), so each run gives one value; the interval is
profiler.runfolder.rounds.bootstrap_ci over those values (seeded: the same runs give the same
interval), the one the launcher's `--repeat auto` stops on. Group fields:

- `n_rounds`: the runs with a speedup (a single-device group: with a throughput), the values
  each interval is over;
- `speedup_median`, `speedup_ci95_low`, `speedup_ci95_high` (×), and the same for
  `scaling_efficiency` (a fraction; efficiency = speedup ÷ devices, run by run) and
  `samples_per_s` (samples/s); null without a value;
- `throughput_basis`: `quiet` when every member and every member's baseline stands on its quiet
  steps, `all` when none does, else `mixed` (analysis.runs.quiet);
- `busy_run_ids`: members and baselines with steps measured while other processes ran
  (`busy_steps` > 0) or measured busy as a whole (env.host_load);
- `noisy_run_ids`: members and baselines whose headline is known to be noise
  (`throughput_noisy`): the report gives no speedup from them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from analysis.runs.entry import RunEntry
from profiler.runfolder.hostload import is_busy
from profiler.runfolder.rounds import bootstrap_ci

__all__ = ["CI_STATS", "round_stats"]

CI_STATS = ("speedup", "scaling_efficiency", "samples_per_s")


def _ci_fields(stat: str, values: Iterable[float | None]) -> dict[str, float | None]:
    ci = bootstrap_ci([v for v in values if v is not None])
    median, low, high = ci if ci is not None else (None, None, None)
    return {f"{stat}_median": median, f"{stat}_ci95_low": low, f"{stat}_ci95_high": high}


def _basis(runs: list[RunEntry]) -> str | None:
    kinds = {r.throughput_basis for r in runs if r.throughput_basis}
    if not kinds:
        return None
    return kinds.pop() if len(kinds) == 1 else "mixed"


def round_stats(members: list[RunEntry], by_id: dict[str, RunEntry]) -> dict[str, Any]:
    """The group fields of the module docstring for one group's ok `members`; `by_id` finds
    their baselines."""
    # every single run a member's speedup divides by (one, or the group mean's runs)
    base_ids = {b for m in members for b in (m.baseline_run_ids or [m.baseline_run_id]) if b}
    bases = [by_id[b] for b in sorted(base_ids) if b in by_id]
    involved = list({r.run_id: r for r in [*members, *bases]}.values())
    key = "speedup" if any(m.speedup is not None for m in members) else "samples_per_s"
    out: dict[str, Any] = {"n_rounds": sum(getattr(m, key) is not None for m in members)}
    for stat in CI_STATS:
        out.update(_ci_fields(stat, (getattr(m, stat) for m in members)))
    out["throughput_basis"] = _basis(involved)
    out["busy_run_ids"] = sorted(
        r.run_id for r in involved if (r.busy_steps or 0) > 0 or is_busy(r.host_load)
    )
    out["noisy_run_ids"] = sorted(r.run_id for r in involved if r.throughput_noisy)
    return out
