"""Stored values no reader can use, read as a typed marker instead of failing every read of the store.

Problem: ingest refuses values no reader can use (``matrix.exportfields``), but a store written by an
older grace-matrix, or edited by hand, may hold them: a latency of zero, negative, NaN or infinite, a
number stored as text, samples that are not numbers, JSON that does not parse or holds NaN, a run status
nobody knows. Every reader converted such a value on its own (``float``, an enum, a logarithm) and
failed on it, and with it every command that reads the store, long after the value was written.

Design: the store's column types (``matrix.store.models``) convert stored values where every read passes, ORM
or Core alike, with the checks here (the ones ingest makes on incoming values, so that what ingest refuses is
what reads as unreadable): a value outside what its column declares reads as an ``Unreadable`` marker (the
stored value as text and what it should have been), never as an exception; an unknown run status reads as
``RunStatus.UNREADABLE``, and other text outside a column's declared choices (a test outcome no writer
records) as a marker (``read_choice``). Readers carry a marker to the verdict: a result row holding one has
the status ``ResultStatus.UNREADABLE`` (``matrix.statuses.row_status``), a failure everywhere, and its figures
are missing, never a number. Every marker made is counted by the innermost ``watch`` block, so that the
command line can say once that the store holds unreadable rows (``matrix.store.check`` finds and lists them).

Invariants: reading a stored value never raises and never changes the store; a marker is never
written back (the column types refuse it); a row holding a marker never passes.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

LATENCY = "a finite number above zero (a latency)"
LATENCIES = "a JSON array of finite numbers above zero (latencies)"


@dataclass(frozen=True)
class Unreadable:
    """A stored value no reader can use: ``stored`` is the value as text (shortened), ``expected`` what
    its column declares. Never equal to a value, never a number, never written."""

    stored: str
    expected: str

    def __str__(self) -> str:
        return f"{self.stored}, not {self.expected}"


@dataclass
class Met:
    """How many markers were made inside a ``watch`` block."""

    count: int = 0


_WATCH: contextvars.ContextVar[Met | None] = contextvars.ContextVar("grace_matrix_unreadable", default=None)


@contextlib.contextmanager
def watch() -> Iterator[Met]:
    """Count the markers made (the unreadable values read) inside the block."""
    met = Met()
    token = _WATCH.set(met)
    try:
        yield met
    finally:
        _WATCH.reset(token)


def note() -> None:
    """Count one unreadable value read (in the innermost ``watch`` block, if any)."""
    met = _WATCH.get()
    if met is not None:
        met.count += 1


def unreadable(value: object, expected: str) -> Unreadable:
    """The marker of stored ``value``, which is not ``expected``; counted (``watch``)."""
    note()
    return Unreadable(_short(value), expected)


def finite_number(value: object) -> float | None:
    """``value`` as a float when it is a finite number (an int or a float, not a bool, not text)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range
        return None
    return number if math.isfinite(number) else None


def is_latency(value: object) -> bool:
    """Whether ``value`` is a finite number above zero (what the regression detectors take logs of)."""
    number = finite_number(value)
    return number is not None and number > 0


def read_number(value: object, positive: bool = False) -> float | Unreadable | None:
    """A stored number as readers use it: a finite float (above zero when ``positive``), None for none,
    else a marker."""
    if value is None:
        return None
    number = finite_number(value)
    if number is None or (positive and not number > 0):
        return unreadable(value, LATENCY if positive else "a finite number")
    return number


def read_json(decoded: object, kind: type[Any], latencies: bool = False) -> Any:
    """A decoded JSON value as readers use it: ``decoded`` when it is a ``kind`` (dict or list) holding
    only finite numbers (with ``latencies``, a list of latencies) or is None, else a marker."""
    if decoded is None:
        return None
    if latencies:
        return decoded if _latencies(decoded) else unreadable(decoded, LATENCIES)
    if not isinstance(decoded, kind):
        return unreadable(decoded, f"a JSON {'object' if kind is dict else 'array'}")
    if not _finite(decoded):
        return unreadable(decoded, "JSON of finite numbers (JSON has no NaN or Infinity)")
    return decoded


def read_choice(value: object, choices: Collection[str]) -> Unreadable | None:
    """The marker of stored ``value`` when it is none of ``choices`` (a column's ``info`` choices: the texts
    its writers record); None when it is one."""
    if isinstance(value, str) and value in choices:
        return None
    return unreadable(value, f"one of {', '.join(sorted(choices))}")


def undecodable(text: object, error: Exception) -> Unreadable:
    """The marker of stored text that is no JSON (``error`` is what the decoder said)."""
    reason = error.msg if isinstance(error, json.JSONDecodeError) else type(error).__name__
    return unreadable(text, f"JSON ({reason})")


def describe(values: Mapping[str, object]) -> str | None:
    """One line naming each unreadable value of a row (column name -> value as read); None when the row
    holds none."""
    bad = [f"{name} holds {value}" for name, value in values.items() if isinstance(value, Unreadable)]
    return f"unreadable stored value: {'; '.join(bad)}" if bad else None


def _latencies(value: object) -> bool:
    """Whether ``value`` is a list of finite numbers above zero (``is_latency`` of each, at C speed: the
    samples of every performance row pass here)."""
    if not isinstance(value, list):
        return False
    if not value:
        return True
    if not set(map(type, value)) <= _NUMBERS or not min(value) > 0:
        return False
    with contextlib.suppress(OverflowError):
        if math.isfinite(sum(value)):  # a NaN or an infinity would make the sum one
            return True
    return all(is_latency(item) for item in value)  # a NaN, an infinity, or numbers summing past a float


_NUMBERS = {int, float}  # exact types: a bool is no number here


def _finite(value: object) -> bool:
    """Whether every number inside a decoded JSON value is finite (Python's json reads NaN, Infinity)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def _short(value: object) -> str:
    try:
        text = repr(value) if isinstance(value, bytes | str) else json.dumps(value, default=str)
    except (ValueError, RecursionError):  # nested too deeply
        text = f"<{type(value).__name__} nested too deeply>"
    return text if len(text) <= 60 else text[:57] + "..."
