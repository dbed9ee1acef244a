"""The report folder swapped in as one unit (docs/reference/metrics.md "Hostile input"): staged,
then renamed into place with SIGINT/SIGTERM held off, undone on any exception; the previous report's
manifest (`.dpscope-report.json`: name → sha256 of each file it wrote) is untrusted input, so
only regular files it lists with their content unchanged are removed, and a non-regular file
under a name the report writes is refused, never moved away."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import tempfile
from pathlib import Path
from typing import Annotated

import msgspec

from profiler.runfolder.errors import InputError, UserError
from profiler.runfolder.inputfile import read_regular

__all__ = ["MANIFEST", "ReportError", "replace_folder"]


class ReportError(UserError):
    """A one-line, user-facing problem (bad folder, unwritable output); the CLI prints it."""


MANIFEST = ".dpscope-report.json"  # {"files": {name: sha256}} of what the last report wrote


def _sha256(path: Path) -> str | None:
    """The content hash of the regular file `path` (never following a link), else None."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        return hashlib.sha256(read_regular(path, "report file")).hexdigest()
    except (OSError, InputError):
        return None


def _check_targets(out_dir: Path, names: list[str]) -> None:
    """Every name the report writes must be free or a regular file: a folder, link, FIFO or
    device there is the user's, so the report refuses instead of moving it away."""
    for name in names:
        try:
            mode = os.lstat(out_dir / name).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode):
            raise OSError(errno.EEXIST, "exists and is not a regular file; move it away", name)


def _swap(out_dir: Path, stage: Path, backup: Path, moves: list[str], texts: dict) -> None:
    """Move the old files into `backup` and the staged ones in; on any exception (Ctrl-C
    included) move everything back first. SIGINT/SIGTERM wait until the swap is over."""
    swapped: list[str] = []
    blocked = {signal.SIGINT, signal.SIGTERM}
    can_block = hasattr(signal, "pthread_sigmask")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked) if can_block else None
    try:
        for name in moves:
            if os.path.lexists(out_dir / name):
                os.replace(out_dir / name, backup / name)
            swapped.append(name)
            if name in texts:
                os.replace(stage / name, out_dir / name)
    except BaseException:
        for name in reversed(swapped):  # undo: the previous report's files go back
            if name in texts:
                (out_dir / name).unlink(missing_ok=True)
            if os.path.lexists(backup / name):
                os.replace(backup / name, out_dir / name)
        raise
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def replace_folder(files: dict[str, str | bytes], out_dir: Path) -> None:
    """Put `files` into `out_dir` as one unit, leaving every other file there alone (the
    folder's README, a `bench/` subfolder, the user's notes).

    All files are first written into a hidden staging folder inside `out_dir` (same filesystem),
    then swapped in by rename, index.html last; the previous report's files move to a hidden
    backup folder that is deleted at the end. Files the previous report wrote that this one does
    not are removed only when its manifest lists them and their content still has the listed
    hash (the manifest is untrusted input). A name this report writes that is a folder, link or
    other non-regular file is refused. Any failure part-way, Ctrl-C included, moves everything
    back, so the previous report stays whole (and the folders a first report created go again,
    if empty); the ReportError names the file that failed."""
    stage: Path | None = None
    backup: Path | None = None
    done = False
    created: list[Path] = []
    try:
        # The folders this call creates (the deepest first): removed again, if still empty, when
        # the report does not land, so that a first report interrupted leaves nothing behind.
        created = [d for d in (out_dir, *out_dir.parents) if not _there(d)]
        out_dir.mkdir(parents=True, exist_ok=True)
        names = [*sorted(n for n in files if n != "index.html"), MANIFEST, "index.html"]
        _check_targets(out_dir, names)
        stage = Path(tempfile.mkdtemp(prefix=".report-new-", dir=out_dir))
        backup = Path(tempfile.mkdtemp(prefix=".report-old-", dir=out_dir))
        # A path from a non-UTF-8 file name cannot be UTF-8: it is written with U+FFFD instead.
        blobs = {
            n: t if isinstance(t, bytes) else t.encode("utf-8", "replace") for n, t in files.items()
        }
        hashes = {n: hashlib.sha256(b).hexdigest() for n, b in blobs.items()}
        texts = {**blobs, MANIFEST: (json.dumps({"files": hashes}, indent=1) + "\n").encode()}
        for name in names:
            try:
                # A plain write is enough in the private staging folder; open() gives the file the
                # umask's mode, which the rename keeps.
                (stage / name).write_bytes(texts[name])
            except OSError as exc:  # name the report file, not the staging folder
                raise OSError(exc.errno, exc.strerror, name) from exc
        stale = [
            n for n, digest in _previous_files(out_dir).items()
            if n not in texts and _sha256(out_dir / n) == digest
        ]  # fmt: skip
        _swap(out_dir, stage, backup, [*stale, *names], texts)
        done = True
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise ReportError(
            f"cannot write the report into {out_dir}{where}: {exc.strerror or exc};"
            " pass another --out (the previous report is unchanged)"
        ) from exc
    finally:
        # The backup is dropped only when the swap finished or was undone (it is empty then).
        for folder in (stage, backup):
            if folder is not None and (done or folder == stage or not any(folder.iterdir())):
                shutil.rmtree(folder, ignore_errors=True)
        if not done:
            _remove_empty(created)


def _there(path: Path) -> bool:
    """Something is at `path` (a link included); False where nothing can be (a name too long)."""
    try:
        path.lstat()
    except OSError:
        return False
    return True


def _remove_empty(folders: list[Path]) -> None:
    """rmdir each folder, deepest first, stopping at the first still there (not empty): rmdir
    never removes anything inside, so nothing but what this call made goes."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            if _there(folder):
                return


class _Manifest(msgspec.Struct):
    files: dict[str, Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]]


def _previous_files(out_dir: Path) -> dict[str, str]:
    """{name: sha256} the previous report's manifest lists: plain file names only; nothing when
    the manifest is missing, unreadable, not a regular file or of an older (hash-less) form."""
    try:
        data = read_regular(out_dir / MANIFEST, "manifest")
        names = msgspec.json.decode(data, type=_Manifest).files
    except (InputError, msgspec.DecodeError, RecursionError):
        return {}
    return {n: h for n, h in names.items() if Path(n).name == n and not n.startswith(".")}
