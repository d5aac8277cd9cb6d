"""The lines of an export as a reader gets them: bounded, decoded, parsed and the header checked.

Problem: an export is a file anyone can truncate, re-encode or edit: a line without end (``/dev/zero``),
bytes that are no UTF-8, a byte-order mark, NaN or a number past a float's range, JSON nested past the
parser's stack, or a header of a newer format. Each must be one ``TransferError`` naming the file and the
line, never a traceback or a value stored that no reader can use.

Design: ``read_jsonl`` yields (location, item) per non-empty line: lines are read at most ``MAX_LINE`` at
a time, decoded as UTF-8 (a leading byte-order mark dropped), parsed with non-finite numbers refused,
and the first item checked as a header (``check_header``: format, version, schema). What the items
mean is ``matrix.transfer``'s business.

Invariant: every item yielded is a JSON object of finite numbers that follows a valid header.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

from matrix.errors import TransferError
from matrix.store.db import SCHEMA_VERSION

EXPORT_FORMAT = "grace-matrix-export"
EXPORT_VERSION = 1


def read_jsonl(
    lines: Iterable[str] | Iterable[bytes], source: str = "<input>"
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Parse an export's lines into (location, item); the header is checked, then yielded too."""
    first = True
    for number, line in _numbered(lines, source):
        where = f"{source}:{number}"
        if not line.strip():
            continue
        try:
            item = json.loads(line, parse_float=_finite_float, parse_constant=_not_finite)
        except _NotFinite as exc:
            raise TransferError(
                f"{where}: {exc.args[0]} is not a finite number; an export holds finite numbers "
                "(null for none)"
            ) from None
        except json.JSONDecodeError as exc:
            raise TransferError(f"{where}: not a JSON line ({exc.msg})") from None
        except RecursionError:
            raise TransferError(f"{where}: JSON nested too deeply to be an export line") from None
        except ValueError as exc:  # e.g. an integer literal longer than Python converts
            raise TransferError(f"{where}: not a JSON line ({exc})") from None
        if not isinstance(item, dict):
            raise TransferError(f"{where}: expected a JSON object, got {type(item).__name__}")
        if first:
            check_header(item, where)
            first = False
        yield where, item
    if first:
        raise TransferError(f"{source}: empty file; expected a grace-matrix export")


class _NotFinite(Exception):
    """A number of a line that is no finite float: NaN, Infinity or a literal past a float's range."""


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _not_finite(text: str) -> float:
    raise _NotFinite(text)  # NaN, Infinity, -Infinity: Python's json reads them, JSON has none


BOM = "\ufeff"  # UTF-8's byte-order mark, allowed at the start of an export (and dropped)
MAX_LINE = 64 << 20  # an export line is tens of kilobytes; past this it is no export (or /dev/zero)


def _bounded(lines: Iterable[str] | Iterable[bytes]) -> Iterator[str | bytes]:
    """The lines of ``lines``; a file's read at most ``MAX_LINE + 1`` at a time, so that input without
    line ends is never read whole."""
    readline = getattr(lines, "readline", None)
    if readline is None:
        yield from lines
        return
    while line := readline(MAX_LINE + 1):
        yield line


def _numbered(lines: Iterable[str] | Iterable[bytes], source: str) -> Iterator[tuple[int, str]]:
    """``enumerate(lines, 1)`` as text; lines may be bytes (a file opened in binary, which gives exact line
    numbers), decoded here, a byte-order mark at the start dropped; a line that is not UTF-8 text, or
    longer than ``MAX_LINE``, is a ``TransferError``."""
    iterator = _bounded(lines)
    number = 0
    while True:
        number += 1
        try:
            line = next(iterator)
            if len(line) > MAX_LINE:
                raise TransferError(
                    f"{source}:{number}: a line of more than {MAX_LINE} bytes; not a grace-matrix export"
                )
            text = line.decode("utf-8") if isinstance(line, bytes) else str(line)
            if number == 1:
                text = text.removeprefix(BOM)  # written by some Windows editors and PowerShell
        except StopIteration:
            return
        except UnicodeDecodeError as exc:
            raise TransferError(
                f"{source}:{number}: not UTF-8 text ({exc.reason} at byte {exc.start}); an export is UTF-8 "
                "JSON lines (re-encode a UTF-16 file, e.g. with iconv -f UTF-16 -t UTF-8)"
            ) from None
        yield number, text


def check_header(item: dict[str, Any], where: str) -> None:
    if item.get("format") != EXPORT_FORMAT:
        raise TransferError(
            f"{where}: not a grace-matrix export (first line must carry format={EXPORT_FORMAT!r})"
        )
    version = item.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TransferError(f"{where}: export version {version!r} is not valid")
    if version > EXPORT_VERSION:
        raise TransferError(
            f"{where}: export version {version} is newer than this grace-matrix reads ({EXPORT_VERSION}); "
            "upgrade grace-matrix"
        )
    schema = item.get("schema")
    if schema is not None and not (isinstance(schema, str) and schema.isdigit()):
        raise TransferError(f"{where}: export schema {schema!r} is not valid (a store revision, '0002')")
    if schema is not None and int(schema) > int(SCHEMA_VERSION):
        raise TransferError(
            f"{where}: export of a store at schema {schema}, newer than this grace-matrix knows "
            f"({SCHEMA_VERSION}); upgrade grace-matrix"
        )
