"""The report's one short label per run (figures, chips, the Run column) and the mapping that holds
them: a run id without a label shows as itself.
"""

from __future__ import annotations

from collections import Counter

from analysis.runs.entry import RunEntry

__all__ = ["Labels", "run_label", "unique_labels"]


class Labels(dict[str, str]):
    """run_id -> label; an id without one reads as the id itself (`labels[rid]`)."""

    def __missing__(self, key: str) -> str:
        return key


def run_label(run: RunEntry) -> str:
    """Short label for figures: mode (the family member: ddp, zero1, fsdp, ...), backend, world
    size and seed."""
    pieces = [str(run.strategy or run.mode or "?")]
    if run.backend not in (None, "none", "dp"):
        pieces.append(str(run.backend))
    pieces.append(f"n{run.world_size or '?'}")
    if run.seed is not None:
        pieces.append(f"s{run.seed}")
    return "·".join(pieces)


def unique_labels(runs: list[RunEntry]) -> Labels:
    """run_id -> label, adding the OS and then a counter where labels would collide."""
    labels = {r.run_id: run_label(r) for r in runs}
    if len({r.os for r in runs}) > 1:
        labels = {r.run_id: f"{labels[r.run_id]}·{r.os or '?'}" for r in runs}
    seen: Counter[str] = Counter()
    for rid, lab in list(labels.items()):
        seen[lab] += 1
        if seen[lab] > 1:
            labels[rid] = f"{lab}#{seen[lab]}"
    return Labels(labels)
