"""The readers of run.json (training and comm runs): decode and validate at the boundary, once,
against the Structs of profiler.runfolder.schema.

Everything after `read_record` / `read_comm_record` (and profiler.runfolder.steps'
`read_steps_frame`) may trust types and ranges: counts >= 0, world size >= 1, finite non-negative
times, known statuses and schema versions. A file that breaks a rule raises `InvalidRecord`, one
line naming the file, the field and what is wrong; analysis then lists the run as `invalid` and
never analyses it. The rules are listed in docs/reference/run-folder.md; the names of the files
and columns are profiler.runfolder.layout's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from profiler.runfolder.errors import InputError
from profiler.runfolder.inputfile import BadJSON, decode_json, read_regular
from profiler.runfolder.schema import FINITE_MAX, CommRecord, RunRecord
from profiler.runfolder.versions import READABLE_RUN_JSON_SCHEMAS

__all__ = [
    "InvalidRecord",
    "read_comm_record",
    "read_record",
    "record_kind",
    "short_repr",
]


class InvalidRecord(InputError):
    """A run.json or steps.csv that breaks the run-folder contract; `field` names the field."""

    def __init__(
        self,
        path: Path,
        field: str,
        problem: str,
        fix: str = "fix or remove this run folder (re-run it to get a valid record)",
    ) -> None:
        # msgspec quotes bad enum values: a 2 MB `status` must not become a 2 MB line.
        problem = " ".join(problem.split())
        problem = problem if len(problem) <= 300 else problem[:299] + "…"
        self.file, self.field, self.problem = str(path), field, problem
        super().__init__(
            path, f"invalid `{field}`: {problem}" if field else f"invalid: {problem}", fix
        )

    def to_dict(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in ("file", "field", "problem")} | {"reason": str(self)}


_AT_RE = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<at>[^`]*)`)?$", re.DOTALL)


def _explain(err: msgspec.ValidationError) -> tuple[str, str]:
    """(field path such as `config.world_size`, problem) from a msgspec error message."""
    m = _AT_RE.match(str(err))
    msg, at = (m["msg"], m["at"] or "") if m else (str(err), "")
    msg = msg.replace(f"`float` <= {FINITE_MAX!r}", "a finite `float`")
    return at.lstrip("."), msg


def short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _decode_json(path: Path) -> dict:
    """The JSON object in `path` (profiler.runfolder.inputfile's reading rules: a regular file under the
    size limit, BOM and lone surrogates accepted); InputError when missing, unreadable or not
    JSON, InvalidRecord when nested too deeply, with a duplicate key or not an object."""
    interrupted = "the run was interrupted while writing; re-run it"
    try:
        raw = decode_json(path, "run.json", "fix or remove this run folder")
    except BadJSON as err:
        if err.reason == "malformed":
            raise InputError(
                path, err.what.replace("not JSON", "unreadable"), interrupted
            ) from None
        if err.reason == "deep":
            raise InvalidRecord(path, "", "nested too deeply to be a run record") from None
        raise InvalidRecord(path, err.field, err.what) from None
    except InputError as err:
        if err.what == "missing":
            raise InputError(path, "missing", "not a run folder") from None
        raise InvalidRecord(path, "", err.what, err.fix) from None
    if not isinstance(raw, dict):
        raise InvalidRecord(path, "", f"expected an object, got {type(raw).__name__}")
    return raw


def _convert(path: Path, raw: dict, kind: type[msgspec.Struct]) -> Any:
    try:
        rec = msgspec.convert(raw, kind)
    except msgspec.ValidationError as err:
        field, problem = _explain(err)
        raise InvalidRecord(path, field, problem) from None
    if rec.schema_version is not None and rec.schema_version not in READABLE_RUN_JSON_SCHEMAS:
        known = ", ".join(map(str, READABLE_RUN_JSON_SCHEMAS))
        raise InvalidRecord(
            path,
            "schema_version",
            f"unknown version {rec.schema_version} (this dpscope reads {known})",
            "analyse it with the dpscope version that wrote it",
        )
    return rec


def read_record(path: Path) -> tuple[RunRecord, dict]:
    """Decode and validate a training run's run.json: (typed record, the raw object for verbatim
    copies and for writers that update it).

    Raises InputError when the file is missing or not JSON, InvalidRecord when it breaks a rule.
    """
    raw = _decode_json(path)
    rec = _convert(path, raw, RunRecord)
    if rec.status != "skipped":  # a run that started knows its layout
        for name in ("world_size", "devices"):
            if getattr(rec.config, name) is None:
                raise InvalidRecord(path, f"config.{name}", f"null on a {rec.status} run")
    return rec, raw


class _Kind(msgspec.Struct):
    kind: Any = None


def record_kind(path: Path) -> str | None:
    """run.json's `kind` (`comm` for a `make bench-comm` folder; absent, i.e. None, for a
    training run), or None when the file is missing or no JSON object: which reader applies."""
    try:
        kind = msgspec.json.decode(read_regular(path, "run.json"), type=_Kind).kind
    except (InputError, RecursionError, msgspec.DecodeError):
        return None
    return kind if isinstance(kind, str) else None


def read_comm_record(path: Path) -> tuple[CommRecord, dict]:
    """Decode and validate a comm run's run.json (`kind: "comm"`): (typed record, raw object).

    Raises InputError when the file is missing or not JSON, InvalidRecord when it breaks a rule
    (a training run's run.json breaks `kind`)."""
    raw = _decode_json(path)
    return _convert(path, raw, CommRecord), raw
