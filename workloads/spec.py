"""What `--model`, `--dataset`, `--loss` and `--model-args`/`--dataset-args` say, parsed without
importing anything: the syntax is checked when the config is built (before any run folder), and
workloads.train.factory imports and calls what a spec names.

A spec is one of:
- a built-in name (`resnet18`, `gpt`, `tokens`, `cross_entropy`, ...);
- `torchvision:NAME` (models only): a builder of `torchvision.models.get_model`;
- `MODULE:FUNCTION`: a function imported from the user's code (the folder the command runs in,
  then PYTHONPATH), e.g. `mypkg.nets:build`.

Keyword arguments are `k=v` entries separated by commas; each value becomes an int, a float, a
bool (`true`/`false`) or else stays a string, e.g. `n_layer=2,n_embd=64,bias=false,act=gelu`.
Numbers are written with the ASCII digits 0-9 (`1e-3`, `-2`, `.5`) and are finite: a value
Python would also read as a number some other way (`١٢`, full-width digits, `1_000`, `nan`,
`inf`) is one SpecError line, never a silent 12 or a NaN.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BUILTIN_DATASETS",
    "BUILTIN_LOSSES",
    "BUILTIN_MODELS",
    "Spec",
    "SpecError",
    "parse_kwargs",
    "parse_spec",
    "spec_slug",
]

# The names the registries of workloads.train.models / data / losses hold (a test keeps them equal).
BUILTIN_MODELS = ("resnet18", "resnet50", "smallcnn", "mlp", "gpt")
BUILTIN_DATASETS = ("synthetic", "digits", "cifar10", "cifar100", "tokens")
BUILTIN_LOSSES = ("cross_entropy", "mse")

_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SpecError(ValueError):
    """A spec or its arguments cannot be used; the message is one line naming it and the fix."""


@dataclass(frozen=True, kw_only=True)
class Spec:
    """One parsed `--model` / `--dataset` / `--loss` value."""

    text: str
    """The value as given (what run.json records and the same-workload key compares)."""
    kind: Literal["builtin", "torchvision", "import"]
    module: str
    """The module to import (`torchvision.models` for torchvision specs, "" for built-ins)."""
    name: str
    """The built-in name, the torchvision builder or the function."""


def parse_spec(
    flag: str, text: str, builtins: tuple[str, ...], *, torchvision: bool = False
) -> Spec:
    """Parse `text` given to `flag`; raises SpecError naming the accepted forms."""
    forms = f"a built-in ({', '.join(builtins)})"
    forms += ", torchvision:NAME" if torchvision else ""
    forms += " or MODULE:FUNCTION (a function in your code)"
    if ":" not in text:
        if text in builtins:
            return Spec(text=text, kind="builtin", module="", name=text)
        raise SpecError(f"{flag} {text!r} is not {forms}")
    module, _, name = text.partition(":")
    if torchvision and module == "torchvision":
        if not _NAME.fullmatch(name):
            raise SpecError(
                f"{flag} {text!r}: give a torchvision.models builder, e.g. torchvision:resnet18"
            )
        return Spec(text=text, kind="torchvision", module="torchvision.models", name=name)
    if not _DOTTED.fullmatch(module) or not _NAME.fullmatch(name):
        raise SpecError(
            f"{flag} {text!r}: MODULE:FUNCTION needs a dotted module and a function name, e.g. "
            f"mypkg.nets:build (else {forms})"
        )
    return Spec(text=text, kind="import", module=module, name=name)


_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def _python_number(text: str) -> bool:
    try:
        float(text)  # int() reads no form float() does not (digits of any script, `_`)
    except ValueError:
        return False
    return True


def _value(flag: str, key: str, text: str) -> int | float | bool | str:
    """One value of `k=v` (see the module docstring)."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text) and math.isfinite(number := float(text)):
        return number
    if _python_number(text):
        raise SpecError(
            f"{flag} {key}={text!r} is not a finite number written with the ASCII digits 0-9 "
            "(no other scripts' digits, no `_`, no nan/inf); write it like 12, -3 or 1e-3"
        )
    return text


def parse_kwargs(flag: str, text: str) -> dict[str, int | float | bool | str]:
    """`k=v,k2=v2` as keyword arguments (see the module docstring); "" is no arguments."""
    kwargs: dict[str, int | float | bool | str] = {}
    for entry in (e.strip() for e in text.split(",")) if text.strip() else ():
        key, eq, value = (part.strip() for part in entry.partition("="))
        if not eq or not _NAME.fullmatch(key):
            raise SpecError(
                f"{flag} entry {entry!r} is not k=v with k a Python name "
                f'(e.g. {flag} "n_layer=2,n_embd=64")'
            )
        if key in kwargs:
            raise SpecError(f"{flag} gives {key} twice; keep one {key}=...")
        kwargs[key] = _value(flag, key, value)
    return kwargs


def spec_slug(text: str) -> str:
    """`text` as part of a folder name: `mypkg.nets:build` -> `mypkg.nets-build`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"
