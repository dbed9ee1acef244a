"""Import the function a `MODULE:FUNCTION` spec names and call it, turning every way that can go
wrong into one SpecError line that names the spec and what to do (the launcher prints it and exits
with code 2 before any run folder exists; see workloads.train.workload).

User modules import from the folder the command runs in (put first on sys.path, as `python -m`
does) and from PYTHONPATH, in the launcher and on every rank alike. A module or function that
calls `sys.exit` is a user error too ("your MODULE:FUNCTION called sys.exit(N)"), never a silent
exit of the launcher.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from workloads.spec import Spec, SpecError

__all__ = ["call_factory", "exit_call", "last_line", "load_function"]


def exit_call(exc: SystemExit) -> str:
    """How the user's code exited, as they would have written it: `sys.exit(3)`, `sys.exit()`."""
    return "sys.exit()" if exc.code is None else f"sys.exit({exc.code!r})"


def last_line(exc: BaseException) -> str:
    """The last line Python prints for `exc` (`ModuleNotFoundError: No module named 'x'`)."""
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def load_function(flag: str, spec: Spec) -> Callable[..., Any]:
    """The function `spec` names (kind `import` or `torchvision`), imported now."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:  # a console script does not add it itself
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(spec.module)
    except SystemExit as exc:
        raise SpecError(
            f"{flag} {spec.text}: your module {spec.module} called {exit_call(exc)} while being "
            "imported; a module dpscope imports must not exit (guard it with "
            '`if __name__ == "__main__":`)'
        ) from None
    except Exception as exc:  # noqa: BLE001 - any error in the user's module is a user error
        raise SpecError(
            f"{flag} {spec.text}: module {spec.module} does not import ({last_line(exc)}); it "
            "must import from the folder you run in or from PYTHONPATH"
        ) from exc
    fn = getattr(module, spec.name, None)
    if not callable(fn):
        public = sorted(  # the functions the module itself defines
            n
            for n, v in vars(module).items()
            if inspect.isfunction(v) and v.__module__ == module.__name__ and n[0] != "_"
        )
        listed = f" (it has: {', '.join(public[:12])})" if public else ""
        raise SpecError(f"{flag} {spec.text}: {spec.module} has no function {spec.name}{listed}")
    return fn


def _parameters(fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter] | None:
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a C function without a signature: let the call decide
        return None


def call_factory(
    fn: Callable[..., Any],
    *,
    flag: str,
    spec: Spec,
    args_flag: str,
    kwargs: Mapping[str, Any],
    provided: Mapping[str, Any],
) -> Any:
    """`fn(**kwargs, **provided)`, where `kwargs` are the user's `args_flag` entries (each must be
    a parameter of `fn`) and `provided` are what dpscope offers (e.g. num_classes), passed only
    to the parameters `fn` names and where the user did not set them."""
    params = _parameters(fn)
    call = dict(kwargs)
    if params is not None:
        open_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        unknown = [k for k in kwargs if k not in params and not open_kw]
        if unknown:
            takes = ", ".join(p for p in params if params[p].kind is not params[p].VAR_POSITIONAL)
            raise SpecError(
                f"{args_flag} {unknown[0]}: {spec.text} takes no parameter {unknown[0]} "
                f"(it takes: {takes or 'none'})"
            )
        call.update({k: v for k, v in provided.items() if k in params and k not in kwargs})
        try:
            inspect.signature(fn).bind(**call)
        except TypeError as exc:
            raise SpecError(
                f"{flag} {spec.text} cannot be called with {sorted(call) or 'no arguments'} "
                f"({exc}); give the missing values in {args_flag}"
            ) from exc
    try:
        return fn(**call)
    except SystemExit as exc:
        raise SpecError(
            f"{flag} {spec.text}: your {spec.text} called {exit_call(exc)}; a factory must "
            "return its result, not exit"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the user's factory failing is a user error
        raise SpecError(f"{flag} {spec.text} raised {last_line(exc)}") from exc
