"""Files and folders the commands write (exports, generated documents, the site): atomic and umask-true.

Problem: a file that a command writes must never be left half written (an interrupted export, a failed
render), so it is written beside its target and renamed over it. The temporary files and folders that
make this possible are created private (0600, 0700), and a rename keeps that mode: the published site
and the exports would be unreadable to everyone but their writer, whatever the umask says.

Design: ``replace_file`` writes through a callback into a temporary file beside the target, gives it the
mode a plain ``open`` would have given (``0o666`` less the umask) and renames it over the target;
``public_mode`` gives that mode (``0o777`` less the umask for folders) for callers that stage a folder.
``write_output`` is every output's way: a file is replaced so, a device or a pipe is written through
(never replaced by a file); a target that is a folder, an SQLite database (a store) or cannot be
written is a ``ConfigError`` of one line, not a traceback. ``write_document`` is the generated
documents' way (``write_output`` with the folder made).

Invariant: a target file is either its old content or its complete new content, never a mix; no
output replaces a store, a device, a pipe or a symbolic link; what is written has the mode the umask
gives, as any file the user creates.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TextIO, TypeVar

from matrix.errors import ConfigError

_T = TypeVar("_T")
_UMASK_LOCK = threading.Lock()


def umask() -> int:
    """The process's umask (read by setting it and setting it back, under a lock)."""
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def public_mode(folder: bool = False) -> int:
    """The mode a file (``0o666``) or folder (``0o777``) created now gets under the umask."""
    return (0o777 if folder else 0o666) & ~umask()


def replace_file(target: Path, write: Callable[[TextIO], _T]) -> _T:
    """Call ``write`` on a text stream whose content replaces ``target`` atomically when it returns."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            result = write(out)
        os.chmod(tmp, public_mode())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return result


_SQLITE_HEADER = b"SQLite format 3\x00"


def check_target(target: Path) -> None:
    """ConfigError when ``target`` is a folder (a file is written there, never into a folder's place) or
    an SQLite database (a store, the one a command reads or another: never overwritten by an output)."""
    if target.is_dir():
        raise ConfigError(f"{target}: is a folder; give the path of a file to write")
    if _is_sqlite_database(target):
        raise ConfigError(f"{target}: is an SQLite database (a store?); not overwritten, give another path")


def _is_sqlite_database(path: Path) -> bool:
    try:
        if not path.is_file():
            return False
        with path.open("rb") as head:
            return head.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER
    except OSError:  # unreadable: whatever it is, writing will say so
        return False


def write_output(target: Path, write: Callable[[TextIO], _T]) -> _T:
    """Call ``write`` on a text stream whose content becomes ``target``: a file is replaced atomically
    (``replace_file``); a device or a pipe (``/dev/stdout``, ``/dev/full``, a FIFO) is written through,
    never replaced by a file. ``check_target``'s refusals and a failed write (no space, no permission)
    are a ``ConfigError`` of one line. A symbolic link is followed: what it points at is written, the link
    stays."""
    if target.is_symlink():
        target = target.resolve()
    check_target(target)
    try:
        if target.exists() and not target.is_file():
            with target.open("w", encoding="utf-8") as out:
                return write(out)
        return replace_file(target, write)
    except OSError as exc:
        raise ConfigError(f"{target}: cannot write: {exc.strerror or exc}") from None


def write_document(target: Path, text: str) -> None:
    """``text`` as the whole of ``target`` (as ``write_output`` writes; its folder made when missing)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{target}: cannot write: {exc.strerror or exc}") from None
    write_output(target, lambda out: out.write(text))
