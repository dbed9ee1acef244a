"""What a run entry says in words, decided once here so that the report and the CLI only show it
(docs/reference/metrics.md §7): the caption of its workload, whether its profiler overhead can be
told from noise, and the advice a run can act on (a `--script` run gets lines of its own code,
never a make target that cannot run its script).
"""

from __future__ import annotations

import shlex
from pathlib import PurePath
from typing import Any

import msgspec

from analysis.jsonsafe import clip
from profiler.runfolder.schema import Config

__all__ = [
    "LABEL_CHARS",
    "Advice",
    "advice",
    "advice_of",
    "error_words",
    "overhead_note",
    "run_reason",
    "workload_label",
]

LABEL_CHARS = 200  # a caption is one line


def workload_label(config: Config, raw_config: dict[str, Any]) -> str:
    """The caption of a run's workload: a script run's file name and arguments
    (`train.py --epochs 1`), else `model/dataset · <scaling> scaling`."""
    if config.script:
        args = raw_config.get("script_args")
        words = [str(a) for a in args] if isinstance(args, list) else []
        text = " ".join([PurePath(config.script).name, *map(shlex.quote, words)])
    else:
        text = f"{config.model}/{config.dataset} · {config.scaling} scaling"
    return clip(text, LABEL_CHARS)


def overhead_note(pct: float | None, noise_pct: float | None) -> tuple[bool | None, str | None]:
    """(`profiler_overhead_within_noise`, `profiler_overhead_note`) of a run.

    An overhead below zero is never a cost: the traced steps cannot have run faster because they
    were traced, so it is noise (or drift) whatever its size. One at or below
    `profiler_overhead_noise_pct` (two standard errors of the difference) cannot be told from
    noise either. Both show as `within noise (±N%)`, N the noise figure ("spread unknown" when
    there are too few steps for one). (None, None) without an overhead."""
    if pct is None:
        return None, None
    if pct >= 0 and (noise_pct is None or pct > noise_pct):
        return False, None
    spread = f"±{noise_pct:.1f}%" if noise_pct is not None else "spread unknown"
    return True, f"within noise ({spread})"


def advice(*, script: str | None, num_buckets: int | None) -> dict[str, str]:
    """The runs JSON's `advice` of a run: what the verdict and findings tell it to try, in the
    form that run can use.

    - `more_steps`: how to measure more unprofiled steps;
    - `bucket_view`, `tune` (+ `tune_note`): DDP's gradients as bucket views, and its bucket
      size; a script run gets the `DDP(...)` argument to add, with the bucket count of its run
      (`metrics.ddp.num_buckets`, DDP's reducer after its rebuild: the allreduce calls per step
      its trace shows), a built-in run the flag and `make tune-ddp`;
    - `exposed`: what to try when the allreduce is exposed;
    - `pair`: what to run for a speedup when no parallel run has a single-device baseline.
    """
    if script is None:
        return {
            "pair": "run `make profile-all`",
            "more_steps": "raise --max-steps",
            "bucket_view": "--gradient-as-bucket-view",
            "tune": "make tune-ddp",
            "tune_note": " (bucket sizes, no_sync)",
            "exposed": "try larger buckets, no_sync gradient accumulation or a faster backend",
        }
    buckets = f"{num_buckets} gradient bucket(s) per step" if num_buckets else "its buckets"
    return {
        "pair": f"profile {script} with --mode single and with --mode ddp, same arguments",
        "more_steps": "let the script run more steps: its own arguments, or a larger --max-steps",
        "bucket_view": "DDP(model, gradient_as_bucket_view=True)",
        "tune": "DDP(model, bucket_cap_mb=...)",
        "tune_note": f" (this run: {buckets}, DDP's default 25 MB each; larger buckets mean "
        "fewer allreduce calls, smaller ones more overlap with backward)",
        "exposed": "try DDP(model, bucket_cap_mb=...) for fewer or more buckets, "
        "`with model.no_sync():` on the micro-batches before the last one when accumulating, "
        "or a faster backend",
    }


class Advice(msgspec.Struct, kw_only=True):
    """A run's or group's `advice` read typed (see `advice`); a key the runs JSON lacks reads as
    a built-in run's advice."""

    pair: str
    more_steps: str
    bucket_view: str
    tune: str
    tune_note: str
    exposed: str


def advice_of(words: dict[str, str]) -> Advice:
    """The `advice` object of a run or group entry as an Advice."""
    fields = msgspec.structs.fields(Advice)
    given = {f.name: words[f.name] for f in fields if isinstance(words.get(f.name), str)}
    return Advice(**{**advice(script=None, num_buckets=None), **given})


def error_words(error: Any) -> str:
    """A run.json `error` as `kind: message` (error.kind: crash, killed, oom, diverged, ...), or
    "no reason recorded"."""
    err = error if isinstance(error, dict) else {}
    why = (err.get("message") if err else error) or "no reason recorded"
    return f"{err['kind']}: {why}" if err.get("kind") else str(why)


def run_reason(err: Any) -> str:
    """One line saying why a run has no numbers from its run.json `error` ('' for none): the
    error's kind, the first line of its message and its rank."""
    if not err:
        return ""
    if isinstance(err, dict):
        where = f" (rank {err['rank']})" if err.get("rank") is not None else ""
        kind = f"{err['kind']}: " if err.get("kind") else ""  # crash, killed, oom, diverged, ...
        first_line = (str(err.get("message") or "failed").splitlines() or ["failed"])[0]
        return f"{kind}{first_line}{where}"
    return str(err)
