"""The fields of an export line checked against the store's columns: the export schema.

Problem: an export is text anyone can edit or generate; a value the store's column type would take but
no reader can use (a run status nobody knows, a latency of zero, samples that are not numbers, a string
longer than PostgreSQL keeps) would be stored, and every later read of the store (summary, regressions,
the dashboard) would fail on it, long after the ingest that let it in reported success.

Design: ``load_fields`` checks every field of a line against its column: its name, its type (the column's
type; a JSON column's ``python_type``), its range (integer widths, finite floats, string lengths), its
nullability and what the column declares beyond its type (``info``'s ``choices``; a latency type's
``positive``; see ``matrix.store.models``), and converts ISO datetimes to UTC. A mismatch is a
``TransferError`` naming the line and the field. The numeric checks are those the column types make on stored
values (``matrix.unreadable``).

Invariant: a row ``load_fields`` accepts is one every reader of the store can read (no value of it
reads as ``Unreadable``).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, cast

from sqlalchemy import BigInteger, Boolean, Column, DateTime, Float, Integer, Table
from sqlalchemy.types import TypeDecorator

from matrix.errors import TransferError
from matrix.store.models import Base
from matrix.unreadable import finite_number, is_latency

LINKS = {"id", "run_pk", "cell_pk", "workload_pk"}  # integer links, replaced by named references


def load_fields(data: dict[str, Any], model: type[Base], where: str) -> dict[str, Any]:
    """``data``'s fields checked against ``model``'s columns (the export schema: names, types, ranges,
    nulls) and converted (ISO datetimes, to UTC); a mismatch is a ``TransferError`` naming ``where`` and
    the field."""
    columns = {c.key: c for c in cast(Table, model.__table__).columns if c.key not in LINKS}
    unknown = sorted(set(data) - set(columns))
    if unknown:
        raise TransferError(f"{where}: unknown field {unknown[0]!r} for {model.__tablename__}")
    values = dict(data)
    for name, value in data.items():
        column = columns[name]
        if value is None:
            if not column.nullable:
                raise TransferError(f"{where}: field {name!r} of {model.__tablename__} must not be null")
            continue
        problem = _type_problem(column, value) or _domain_problem(column, value)
        if problem:
            raise TransferError(f"{where}: field {name!r} of {model.__tablename__} {problem}")
        if isinstance(column.type, DateTime):
            values[name] = _utc(dt.datetime.fromisoformat(value))
    return values


def _utc(moment: dt.datetime) -> dt.datetime:
    """``moment`` in UTC (a time without an offset is UTC): SQLite keeps no offset, so a time is stored as
    its UTC wall clock, every time the store holds is UTC. ``OverflowError`` when that leaves the calendar
    (year 1 at +05:00)."""
    return moment.astimezone(dt.timezone.utc) if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def _type_problem(column: Column[Any], value: Any) -> str | None:
    """Why ``value`` cannot be stored in ``column`` on every database; None when it can."""
    kind = column.type
    if isinstance(kind, TypeDecorator) and isinstance(kind.impl_instance, Float):
        kind = kind.impl_instance  # a Number or a Latency (its domain: ``_domain_problem``)
    if isinstance(kind, DateTime):
        try:
            _utc(dt.datetime.fromisoformat(value))
        except (TypeError, ValueError):
            return f"is not an ISO datetime: {_short(value)}"
        except OverflowError:
            return f"is out of range in UTC: {_short(value)}"
        return None
    if isinstance(kind, Boolean):
        return None if isinstance(value, bool) else f"must be true or false, not {_short(value)}"
    if isinstance(kind, Integer):  # BigInteger is one
        bits = 64 if isinstance(kind, BigInteger) else 32
        if not isinstance(value, int) or isinstance(value, bool):
            return f"must be an integer, not {_short(value)}"
        if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            return f"is out of range for a {bits}-bit integer: {_short(value)}"
        return None
    if isinstance(kind, Float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, not {_short(value)}"
        return None if finite_number(value) is not None else f"is out of range for a float: {_short(value)}"
    expected = kind.python_type
    if expected is str:
        if not isinstance(value, str):
            return f"must be a string, not {_short(value)}"
        length = getattr(kind, "length", None)
        if length is not None and len(value) > length:
            return f"is longer than {length} characters ({len(value)})"
        return None
    if not isinstance(value, expected):
        return f"must be a JSON {'object' if expected is dict else 'array'}, not {_short(value)}"
    return None


def _domain_problem(column: Column[Any], value: Any) -> str | None:
    """Why ``value``, of the right type, is outside what ``column.info`` declares (``models``); None when
    it is inside."""
    choices = column.info.get("choices")
    if choices is not None and value not in {member.value for member in choices}:
        return f"is {_short(value)}, not one of {sorted(member.value for member in choices)}"
    if getattr(column.type, "positive", False):
        for item in value if isinstance(value, list) else [value]:
            if not is_latency(item):
                what = "hold only numbers" if isinstance(value, list) else "be a number"
                return f"must {what} above zero (latencies), not {_short(item)}"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
