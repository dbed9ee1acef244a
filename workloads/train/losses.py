"""`--loss`: the built-in losses (a registry) or `MODULE:FUNCTION(output, target) -> scalar`, and
the eval metrics of one test batch, whose sums over batches and ranks give the eval record.

What eval reports depends on the output (`output_kind`):
- `class_scores`, output (N, C) with integer targets (N,): the loss, top-1 and top-5 (%);
- `sequence`, output (N, T, C) with integer targets (N, T): the loss, token top-1 (%) and
  perplexity = exp(mean token cross-entropy of the logits), whatever `--loss` is;
- `other` (e.g. regression under `mse`): the loss only.
The eval loss is the batch loss weighted by the batch's samples (tokens for sequences), so it is
the exact test mean for a loss that is a mean over samples (tokens), as both built-ins are.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from workloads.spec import BUILTIN_LOSSES, Spec, SpecError, parse_spec
from workloads.train.factory import exit_call, last_line, load_function

__all__ = [
    "best_epoch",
    "LOSSES",
    "LossFn",
    "build_loss",
    "check_loss",
    "eval_record",
    "eval_sums",
    "output_kind",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; sequence outputs (N, T, C) with targets (N, T) are flattened to
    (N*T, C) and (N*T,), so it is the mean over tokens."""
    if output.ndim == 3 and target.ndim == 2:
        return F.cross_entropy(output.flatten(0, 1), target.flatten())
    return F.cross_entropy(output, target)


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error, the target cast to the output's dtype (shapes must match)."""
    return F.mse_loss(output, target.to(output.dtype))


LOSSES: dict[str, LossFn] = {"cross_entropy": cross_entropy, "mse": mse}
assert tuple(LOSSES) == BUILTIN_LOSSES  # the config validates names against BUILTIN_LOSSES


def build_loss(spec: str | Spec) -> LossFn:
    """The loss function `spec` names (imported for MODULE:FUNCTION)."""
    if isinstance(spec, str):
        spec = parse_spec("--loss", spec, BUILTIN_LOSSES)
    return LOSSES[spec.name] if spec.kind == "builtin" else load_function("--loss", spec)


def _shape(value: object) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__


def check_loss(spec: Spec, loss_fn: LossFn, output: object, target: object) -> None:
    """Raise SpecError unless `loss_fn(output, target)` is a scalar tensor (one sample batch)."""
    try:
        value = loss_fn(output, target)  # type: ignore[arg-type]
    except SystemExit as exc:
        raise SpecError(
            f"--loss {spec.text}: your {spec.text} called {exit_call(exc)} on a sample batch; a "
            "loss must return a scalar tensor, not exit"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the user's loss failing is a user error
        raise SpecError(
            f"--loss {spec.text} raised {last_line(exc)} on a sample batch (output "
            f"{_shape(output)}, target {_shape(target)})"
        ) from exc
    if not isinstance(value, torch.Tensor) or value.ndim != 0:
        shape = _shape(value)
        raise SpecError(
            f"--loss {spec.text} returned {shape}, not a scalar tensor; reduce it "
            "(e.g. .mean()) so that backward() has one value"
        )


def output_kind(output: torch.Tensor, target: torch.Tensor) -> str:
    """class_scores | sequence | other (see the module docstring)."""
    if target.is_floating_point() or output.ndim != target.ndim + 1:
        return "other"
    if output.shape[:-1] != target.shape:
        return "other"
    return {1: "class_scores", 2: "sequence"}.get(target.ndim, "other")


def eval_sums(output: torch.Tensor, target: torch.Tensor, loss_fn: LossFn) -> torch.Tensor:
    """float64 [loss sum, top-1 hits, top-5 hits, cross-entropy sum, units, samples] of one
    batch, where units are samples (tokens for sequences); summed over batches and ranks."""
    kind = output_kind(output, target)
    output = output.float()
    units = target.numel() if kind == "sequence" else len(target)
    zero = torch.zeros((), dtype=torch.float64, device=output.device)
    top1 = top5 = ce = zero
    if kind != "other":
        scores, labels = output.flatten(0, -2), target.flatten()  # (units, C), (units,)
        top = scores.topk(min(5, scores.shape[1]), dim=1).indices
        top1 = (top[:, 0] == labels).sum().double()
        top5 = (top == labels[:, None]).any(dim=1).sum().double()
        ce = F.cross_entropy(scores, labels, reduction="sum").double()
    loss = loss_fn(output, target).double() * units
    counts = torch.tensor([units, len(target)], dtype=torch.float64, device=output.device)
    return torch.cat([torch.stack([loss, top1, top5, ce]), counts])


def eval_record(kind: str, sums: list[float], *, epoch: int) -> dict:
    """The run.json eval entry from the summed `eval_sums` (docs/reference/run-folder.md)."""
    loss, top1, top5, ce, units, samples = sums
    units = max(units, 1.0)
    scored = kind != "other"
    return {
        "epoch": epoch,
        "output": kind,
        "test_loss": loss / units,
        "top1_pct": 100.0 * top1 / units if scored else None,
        "top5_pct": 100.0 * top5 / units if kind == "class_scores" else None,
        # exp overflows a float past ~709 (a diverged run): no number rather than inf in JSON
        "perplexity": math.exp(ce / units) if kind == "sequence" and ce / units < 700 else None,
        "samples": int(samples),
        "tokens": int(units) if kind == "sequence" else None,
    }


def best_epoch(epochs: list[dict]) -> dict | None:
    """The eval entry with the highest top-1 accuracy (token top-1 for sequences), or, for an
    output without one (e.g. regression), the lowest test loss; earliest on ties. None without
    evals."""
    if not epochs:
        return None
    if any(e.get("top1_pct") is None for e in epochs):
        return min(epochs, key=lambda e: (e["test_loss"], e["epoch"]))
    return max(epochs, key=lambda e: (e["top1_pct"], -e["epoch"]))
