"""The rows of the store that hold a value no reader can use, found and listed.

Problem: a store written by an older grace-matrix, or edited by hand, may hold values ingest now refuses
(``matrix.exportfields``). Readers read them as failures (``matrix.unreadable``), but a person must be
told that the store holds such rows, how many, and where, to repair or remove them; and an export must
not carry them to a store whose ingest would refuse the whole file.

Design: ``find_unreadable`` reads, table by table, the columns whose values may read as unreadable
(``models.checked_columns``, read through the same column types every reader uses) and the columns that
declare the texts they take (``models.choice_columns``: a run's status, a test's outcome), and returns one
``UnreadableRow`` per row that holds such a value, with its table, primary key, run and record key.
``count_unreadable`` opens a store read-only to count them (the command line's one warning line after a
command met one; ``grace-matrix check-store`` lists them).

Invariant: read-only; a row is listed once, with every unreadable value it holds.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, null, select
from sqlalchemy.orm import Session

from matrix.store.db import StoreAccess, open_store
from matrix.store.models import (
    RESULT_TABLES,
    Base,
    Cell,
    Run,
    Workload,
    checked_columns,
    choice_columns,
    choices,
)
from matrix.unreadable import Unreadable, read_choice

CHECK_COMMAND = "grace-matrix check-store"
_CHUNK = 500  # bound the number of bound parameters of one IN (...)


@dataclass(frozen=True)
class UnreadableRow:
    """One stored row holding values no reader can use (``values``: column name and marker)."""

    table: str
    pk: int
    run_uid: str | None  # the run the row belongs to, or is; None for a cell or a workload
    record_key: str | None
    values: tuple[tuple[str, Unreadable], ...]

    @property
    def where(self) -> str:
        """The row as a person finds it: table and id, its record key and run where it has them."""
        key = f" {self.record_key!r}" if self.record_key else ""
        if self.table == Run.__tablename__:
            return f"{self.table} id {self.pk} (run {self.run_uid})"
        return f"{self.table} id {self.pk}{key}{f' of run {self.run_uid}' if self.run_uid else ''}"

    def line(self) -> str:
        found = "; ".join(f"{name} holds {value}" for name, value in self.values)
        return f"{self.where}: {found}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "id": self.pk,
            "run": self.run_uid,
            "record_key": self.record_key,
            "values": {name: {"stored": v.stored, "expected": v.expected} for name, v in self.values},
        }


def find_unreadable(session: Session, run_pks: Collection[int] | None = None) -> list[UnreadableRow]:
    """Every row holding a value no reader can use, of the whole store or of the runs ``run_pks`` (their
    result rows, cells and workloads too), table by table, in primary key order."""
    found: list[UnreadableRow] = []
    for model in (Run, Cell, Workload, *RESULT_TABLES):
        found.extend(_rows(session, model, run_pks))
    return found


def count_unreadable(url: str | None) -> int:
    """How many rows of the store at ``url`` hold a value no reader can use (opened read-only)."""
    Session = open_store(url, StoreAccess.READ_ONLY)
    try:
        with Session() as session:
            return len(find_unreadable(session))
    finally:
        bind = Session.kw.get("bind")
        if bind is not None:
            bind.dispose()


def _rows(session: Session, model: type[Base], run_pks: Collection[int] | None) -> Iterator[UnreadableRow]:
    """The rows of ``model`` (``Run``, a result table, ``Cell`` or ``Workload``) holding an unreadable
    value: one its column type reads as a marker, or text outside its column's choices."""
    checked = (*checked_columns(model), *choice_columns(model))
    if not checked:
        return
    table = model.__tablename__
    result = model in RESULT_TABLES
    allowed = [(c.key, choices(c) if "choices" in c.info else None) for c in checked]  # once per table
    seen: set[int] = set()  # a cell or a workload of runs of several chunks
    for chunk in _chunks(run_pks):
        stmt = _select(model, result, checked, chunk)
        for pk, uid, record_key, *values in session.execute(stmt):
            read = [
                (name, _as_read(value, texts)) for (name, texts), value in zip(allowed, values, strict=True)
            ]
            bad = tuple((name, value) for name, value in read if value is not None)
            if bad and pk not in seen:
                seen.add(pk)
                yield UnreadableRow(table, pk, uid, record_key, bad)


def _as_read(value: object, texts: frozenset[str] | None) -> Unreadable | None:
    """The marker a stored ``value`` reads as (``texts``: its column's choices, if it declares them); None
    when it is readable."""
    if isinstance(value, Unreadable):
        return value
    return read_choice(value, texts) if texts is not None else None


def _select(model: type[Any], result: bool, checked: Sequence[Any], chunk: list[int] | None) -> Select[Any]:
    """The select of ``model``'s id, run uid, record key and ``checked`` columns (of the runs ``chunk``)."""
    if result:
        stmt = select(model.id, Run.uid, model.record_key, *checked).join(Run, model.run_pk == Run.id)
        return (
            stmt.order_by(model.id)
            if chunk is None
            else stmt.where(model.run_pk.in_(chunk)).order_by(model.id)
        )
    if model is Run:
        stmt = select(Run.id, Run.uid, null(), *checked).order_by(Run.id)
        return stmt if chunk is None else stmt.where(Run.id.in_(chunk))
    stmt = select(model.id, null(), null(), *checked).order_by(model.id)
    if chunk is None:
        return stmt
    if model is Cell:
        return stmt.where(Cell.id.in_(select(Run.cell_pk).where(Run.id.in_(chunk))))
    used = [
        select(m.workload_pk).where(m.run_pk.in_(chunk)) for m in RESULT_TABLES if hasattr(m, "workload_pk")
    ]
    return stmt.where(model.id.in_(used[0].union(*used[1:])))


def _chunks(run_pks: Collection[int] | None) -> Iterator[list[int] | None]:
    if run_pks is None:
        yield None
        return
    items = sorted(run_pks)
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]
