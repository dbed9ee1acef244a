"""The one way dpscope opens a record file it reads (run.json, steps.csv, comm.csv, tune.json,
traces-part JSON, the report manifest): docs/reference/run-folder.md "Reading rules".

- Only regular files: a FIFO, a device or a folder under a record's name is refused with one
  line, never opened for a blocking read (open uses O_NONBLOCK, then fstat decides).
- A size limit per kind of file (`LIMITS`, overridable with `DPSCOPE_MAX_<KIND>_BYTES`): a file
  over it is refused before it is read, so memory stays bounded.
- A UTF-8 byte-order mark (Excel writes one) is dropped.
- JSON: a lone UTF-16 surrogate escape (`"\\udc80"`) decodes as U+FFFD instead of failing the
  whole record; nesting deeper than `MAX_DEPTH` is refused with one line (every later reader,
  the report's recursion included, may then walk the object).

Torch-free and below `profiler.runfolder.records` (it imports only profiler.runfolder.errors).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import msgspec

from profiler.runfolder.errors import InputError, safe_text

__all__ = [
    "BOM",
    "BadJSON",
    "LIMITS",
    "MAX_DEPTH",
    "decode_json",
    "limit_of",
    "read_regular",
    "replace_lone_surrogates",
]

BOM = b"\xef\xbb\xbf"
MIB = 1 << 20
# Bytes a file of each kind may hold: far above anything dpscope writes (a 1,000-rank run.json is
# < 1 MiB; a 1,000,000-row steps.csv is ~150 MiB), far below what would exhaust memory.
LIMITS: dict[str, int] = {
    "run.json": 64 * MIB,
    "steps.csv": 512 * MIB,
    "comm.csv": 16 * MIB,
    "tune.json": 64 * MIB,
    "part": 256 * MIB,
    "manifest": 1 * MIB,
    "report file": 1024 * MIB,  # a report file hashed against its manifest
}
MAX_DEPTH = 64  # levels of JSON nesting a record may have (dpscope writes at most 6)


def limit_of(kind: str) -> int:
    """The byte limit of `kind` (LIMITS), or `DPSCOPE_MAX_<KIND>_BYTES` when set to an integer."""
    value = os.environ.get(_env_name(kind), "")
    return int(value) if value.isdigit() else LIMITS[kind]


def _kind_of(st_mode: int) -> str:
    if stat.S_ISDIR(st_mode):
        return "a folder"
    if stat.S_ISFIFO(st_mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(st_mode) or stat.S_ISBLK(st_mode):
        return "a device"
    if stat.S_ISSOCK(st_mode):
        return "a socket"
    return "not a regular file"


def read_regular(
    path: Path, kind: str, fix: str = "replace it with the file dpscope wrote"
) -> bytes:
    """The bytes of the regular file `path` (a leading BOM dropped); InputError when it is
    missing, not a regular file, unreadable or over `kind`'s size limit (limit_of)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise InputError(path, "missing", fix) from None
    except OSError as err:
        raise InputError(path, f"unreadable ({err.strerror})", "check its permissions") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(path, f"is {_kind_of(st.st_mode)}, not a regular file", fix)
        limit = limit_of(kind)
        if st.st_size > limit:
            raise InputError(
                path,
                f"{st.st_size:,} bytes, over the {limit:,}-byte limit of a {kind}",
                f"{fix}, or raise the limit with {_env_name(kind)}",
            )
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            data = f.read(limit + 1)
    except OSError as err:
        raise InputError(path, f"unreadable ({err.strerror or err})", "check the file") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > limit:  # grew while being read
        raise InputError(path, f"over the {limit:,}-byte limit of a {kind}", fix)
    return data[len(BOM) :] if data.startswith(BOM) else data


def _env_name(kind: str) -> str:
    return "DPSCOPE_MAX_" + re.sub(r"\W", "_", kind).upper() + "_BYTES"


# A JSON escape at a time, so `\\udc80` (an escaped backslash, then text) is left alone.
_ESCAPE = re.compile(
    rb"\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|u[dD][89a-fA-F][0-9a-fA-F]{2}|.)",
    re.DOTALL,
)
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]", re.ASCII)


def _fix_escape(m: re.Match) -> bytes:
    text = m[0]
    return rb"\ufffd" if len(text) == 6 and text[1:2] == b"u" else text


def replace_lone_surrogates(data: bytes) -> bytes:
    """JSON `data` with every lone UTF-16 surrogate escape replaced by `\\ufffd` (U+FFFD);
    proper surrogate pairs (an emoji) and escaped backslashes are kept."""
    if not _SURROGATE.search(data):
        return data  # the common case: one scan, no rewrite
    return _ESCAPE.sub(_fix_escape, data)


def _too_deep(obj: Any, limit: int) -> bool:
    """True when `obj` nests more than `limit` lists/objects deep (iterative: no recursion)."""
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        elif not isinstance(node, list):
            continue
        if depth > limit:
            return True
        stack.extend((v, depth + 1) for v in node if isinstance(v, dict | list))
    return False


class BadJSON(InputError):
    """decode_json's refusal; `reason` is `malformed`, `deep` or `duplicate` (`field` then names
    the duplicated key's path), so a record reader can call the file invalid."""

    def __init__(self, path: Path, reason: str, what: str, fix: str, field: str = "") -> None:
        self.reason, self.field = reason, field
        super().__init__(path, what, fix)


def _duplicate_key(data: bytes) -> str | None:
    """The first key an object of `data` holds twice (msgspec keeps the last silently), or None.
    Only called on depth-checked data, so the stdlib parser's recursion is bounded."""
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict:
        keys = [k for k, _ in items]
        if not found and len(set(keys)) != len(keys):
            found.extend(k for i, k in enumerate(keys) if k in keys[:i])
        return dict(items)

    json.loads(data, object_pairs_hook=pairs)
    return safe_text(found[0]) if found else None


def decode_json(
    path: Path,
    kind: str,
    fix: str = "replace it with the file dpscope wrote",
    *,
    unique: bool = True,
) -> Any:
    """The JSON value in the regular file `path` (read_regular's rules, then lone surrogates
    replaced, nesting bounded by MAX_DEPTH and, with `unique`, every object's keys distinct).

    Raises InputError when the file cannot be read, BadJSON when its content breaks a rule."""
    data = replace_lone_surrogates(read_regular(path, kind, fix))
    deep = f"nested too deeply (over {MAX_DEPTH} levels)"
    try:
        value = msgspec.json.decode(data)
    except RecursionError:
        raise BadJSON(path, "deep", deep, fix) from None
    except msgspec.DecodeError as err:
        raise BadJSON(path, "malformed", f"not JSON ({err})", fix) from None
    if _too_deep(value, MAX_DEPTH):
        raise BadJSON(path, "deep", deep, fix)
    if unique and (key := _duplicate_key(data)) is not None:
        raise BadJSON(path, "duplicate", f"key `{key}` given twice", fix, field=key)
    return value
