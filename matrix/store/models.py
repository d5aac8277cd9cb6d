"""The results store schema: one set of SQLAlchemy 2.0 typed models for SQLite and PostgreSQL.

Problem: every cell of the matrix (a PyTorch x Triton x CUDA environment) produces correctness verdicts,
performance samples, parameter-indirection stage outcomes and CGCT diagnostics; nightly runs on many
machines must merge into one history that regression detection and the dashboards read.

Design: a ``Run`` is one execution of the suites in one ``Cell``. A cell row is identified by the
fingerprint of its environment (torch, Triton, CUDA runtime, driver, GPU, Python, platform), so two
machines with the same stack share a cell row. Results hang off the run. Every result row carries the
pytest node id and a ``record_key`` unique within its run, which makes ingest and merge idempotent.

Invariants:
- ``Run.uid`` is globally unique (a UUID string); merge and ingest key on it, never on integer ids.
- (run, record_key) is unique in every result table: the recorder writes each record once.
- Raw samples are stored, never only their median.
- Every text and JSON value is cleaned by its column type (``matrix.text.store_text``) on the way in, so
  no database refuses a row for a character the other accepts.
- A column's type and ``info`` declare what a value must be, for what writes rows from outside
  (``matrix.exportfields`` checks incoming values) and for readers (the types check stored ones): a
  ``Number`` is finite, a ``Latency`` (or each item of a ``Latencies`` array) is also above zero (the
  regression detectors take logarithms of latencies), JSON holds finite numbers only; ``info``'s
  ``choices`` are the enum members it takes (readers convert it, ``RunStatus.read``; other text reads
  as unreadable, ``choice_columns``).
- Reading never fails on a stored value: one outside its declaration (written by an older version or by
  hand) reads as a ``matrix.unreadable.Unreadable`` marker, which readers judge a failure; a marker is
  never written.
- Schema changes go through Alembic migrations (matrix/migrations); ``SCHEMA_VERSION`` names the head.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from matrix import unreadable
from matrix.statuses import TEST_OUTCOMES, StoredText
from matrix.text import store_text, store_value
from matrix.unreadable import Unreadable


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class CleanString(TypeDecorator[str]):
    """A ``String`` whose values pass ``matrix.text.store_text`` on the way in (both databases)."""

    impl = String
    cache_ok = True

    @property
    def python_type(self) -> type[Any]:
        return str

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return store_text(value) if isinstance(value, str) else value


class CleanText(CleanString):
    """A ``Text`` column cleaned like ``CleanString``."""

    impl = Text
    cache_ok = True


def _refuse_unreadable(value: object) -> None:
    if isinstance(value, Unreadable):
        raise ValueError(f"an unreadable stored value is never written back ({value})")


class Number(TypeDecorator[float | Unreadable]):
    """A ``Float`` that reads as a finite number, or as an ``Unreadable`` marker (NaN, infinity, text)."""

    impl = Float
    cache_ok = True
    positive = False  # above zero too (a ``Latency``)

    def process_bind_param(self, value: float | Unreadable | None, dialect: Dialect) -> float | None:
        _refuse_unreadable(value)
        return cast(float | None, value)

    def process_result_value(self, value: Any, dialect: Dialect) -> float | Unreadable | None:
        return unreadable.read_number(value, self.positive)


class Latency(Number):
    """A ``Number`` above zero."""

    cache_ok = True
    positive = True


class JSONObject(TypeDecorator[Any]):
    """A JSON object; every string inside it passes ``store_text``. ``python_type`` is what an export
    must give for it (``matrix.exportfields`` checks). Reads as the decoded value, or as an ``Unreadable``
    marker for text that is no JSON, JSON of another kind, or JSON with NaN or Infinity."""

    impl = JSON
    cache_ok = True
    positive = False  # an array of latencies (``Latencies``)

    @property
    def python_type(self) -> type[Any]:
        return dict

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        _refuse_unreadable(value)
        return store_value(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return unreadable.read_json(value, self.python_type, latencies=self.positive)

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[Any], Any]:
        decode = super().result_processor(dialect, coltype)

        def read(value: Any) -> Any:
            try:
                return decode(value) if decode is not None else self.process_result_value(value, dialect)
            except (ValueError, TypeError, RecursionError) as exc:  # no JSON text (or not text at all)
                return unreadable.undecodable(value, exc)

        return read


class JSONList(JSONObject):
    """A JSON array, cleaned like ``JSONObject``."""

    cache_ok = True

    @property
    def python_type(self) -> type[Any]:
        return list


class Latencies(JSONList):
    """A JSON array of latencies (each a finite number above zero)."""

    cache_ok = True
    positive = True


CHECKED_TYPES = (Number, JSONObject)
"""Column types whose stored values may read as ``Unreadable`` (``checked_columns``)."""


class Base(DeclarativeBase):
    """Every text column is a ``CleanString``/``CleanText`` and every JSON one a ``JSONObject``/``JSONList``:
    one cleaning rule (``matrix.text.store_text``) at the store boundary, the same on every database."""

    type_annotation_map = {dict[str, Any]: JSONObject, list[Any]: JSONList, str: CleanText}


class RunStatus(StoredText):
    RUNNING = "running"
    COMPLETE = "complete"  # the suites finished (tests may have failed; see the results)
    FAILED = "failed"  # the suites could not be run (collection or usage error)
    CRASHED = "crashed"  # the process died; everything recorded before is kept
    INSTALL_FAILED = "install_failed"  # the cell's environment could not be built
    UNREADABLE = "unreadable"  # read only: a stored status no writer records; judged a failure

    @classmethod
    def read(cls, text: str | None) -> RunStatus:
        """The member for stored ``text``; ``UNREADABLE`` (counted, ``matrix.unreadable.watch``) for text
        this version does not write."""
        member = _RUN_STATUSES.get(text or "")
        if member is None:
            unreadable.note()
            return cls.UNREADABLE
        return member


WRITTEN_RUN_STATUSES = tuple(s for s in RunStatus if s is not RunStatus.UNREADABLE)
_RUN_STATUSES = {s.value: s for s in WRITTEN_RUN_STATUSES}


class Cell(Base):
    """One environment of the matrix, identified by its fingerprint."""

    __tablename__ = "cells"

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(CleanString(64), unique=True)
    cell_id: Mapped[str] = mapped_column(CleanString(128), index=True)  # id in matrix.toml, e.g. "torch-2.11"
    kind: Mapped[str] = mapped_column(CleanString(32))  # venv | current | triton-only
    torch_version: Mapped[str | None] = mapped_column(CleanString(64))
    triton_version: Mapped[str | None] = mapped_column(CleanString(64))
    cuda_runtime: Mapped[str | None] = mapped_column(CleanString(32))
    driver_version: Mapped[str | None] = mapped_column(CleanString(64))
    gpu_name: Mapped[str | None] = mapped_column(CleanString(128))
    gpu_capability: Mapped[str | None] = mapped_column(CleanString(16))
    python_version: Mapped[str] = mapped_column(CleanString(32))
    platform: Mapped[str] = mapped_column(CleanString(128))
    extra: Mapped[dict[str, Any] | Unreadable] = mapped_column(JSONObject, default=dict)

    runs: Mapped[list[Run]] = relationship(back_populates="cell")


class Run(Base):
    """One execution of the suites in one cell."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    uid: Mapped[str] = mapped_column(CleanString(36), unique=True)
    cell_pk: Mapped[int] = mapped_column(ForeignKey("cells.id"), index=True)
    status: Mapped[str] = mapped_column(
        CleanString(32), default=RunStatus.RUNNING.value, info={"choices": WRITTEN_RUN_STATUSES}
    )
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    label: Mapped[str | None] = mapped_column(CleanString(128), index=True)  # e.g. "nightly-2026-11-29"
    git_sha: Mapped[str | None] = mapped_column(CleanString(64))
    host: Mapped[str | None] = mapped_column(CleanString(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    command: Mapped[str | None] = mapped_column(CleanText)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    message: Mapped[str | None] = mapped_column(CleanText)

    cell: Mapped[Cell] = relationship(back_populates="runs")
    outcomes: Mapped[list[TestOutcome]] = relationship(back_populates="run", cascade="all, delete-orphan")
    correctness: Mapped[list[CorrectnessResult]] = relationship(
        back_populates="run", cascade="all, delete-orphan"
    )
    performance: Mapped[list[PerformanceResult]] = relationship(
        back_populates="run", cascade="all, delete-orphan"
    )
    pi_stages: Mapped[list[PIStageResult]] = relationship(back_populates="run", cascade="all, delete-orphan")
    diagnostics: Mapped[list[Diagnostic]] = relationship(back_populates="run", cascade="all, delete-orphan")


class Workload(Base):
    """A workload as it was when it ran: same name and a different code hash is a different row."""

    __tablename__ = "workloads"
    __table_args__ = (UniqueConstraint("name", "code_hash"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(CleanString(128), index=True)
    code_hash: Mapped[str] = mapped_column(CleanString(64), default="")
    tier: Mapped[str] = mapped_column(CleanString(16), default="smoke")
    tags: Mapped[list[Any] | Unreadable] = mapped_column(JSONList, default=list)


class _RunResult:
    """Columns every result row has: its run, the pytest node id and a key unique within the run."""

    id: Mapped[int] = mapped_column(primary_key=True)
    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    record_key: Mapped[str] = mapped_column(CleanString(512))
    nodeid: Mapped[str] = mapped_column(CleanText, default="")
    recorded_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TestOutcome(_RunResult, Base):
    """Every pytest test outcome of a run, recorded or not by a suite."""

    __tablename__ = "test_outcomes"
    __table_args__ = (UniqueConstraint("run_pk", "record_key"),)

    outcome: Mapped[str] = mapped_column(CleanString(16), info={"choices": TEST_OUTCOMES})
    duration_s: Mapped[float | Unreadable | None] = mapped_column(Number)
    message: Mapped[str | None] = mapped_column(CleanText)
    worker: Mapped[str | None] = mapped_column(CleanString(32))

    run: Mapped[Run] = relationship(back_populates="outcomes")


class CorrectnessResult(_RunResult, Base):
    __tablename__ = "correctness_results"
    __table_args__ = (UniqueConstraint("run_pk", "record_key"),)

    workload_pk: Mapped[int] = mapped_column(ForeignKey("workloads.id"), index=True)
    mode: Mapped[str] = mapped_column(CleanString(32))
    status: Mapped[str] = mapped_column(CleanString(32))
    reason: Mapped[str | None] = mapped_column(CleanText)
    errors: Mapped[dict[str, Any] | Unreadable] = mapped_column(JSONObject, default=dict)
    tolerance: Mapped[dict[str, Any] | Unreadable] = mapped_column(JSONObject, default=dict)
    details: Mapped[dict[str, Any] | Unreadable] = mapped_column(JSONObject, default=dict)

    run: Mapped[Run] = relationship(back_populates="correctness")
    workload: Mapped[Workload] = relationship()


class PerformanceResult(_RunResult, Base):
    __tablename__ = "performance_results"
    __table_args__ = (UniqueConstraint("run_pk", "record_key"),)

    workload_pk: Mapped[int] = mapped_column(ForeignKey("workloads.id"), index=True)
    mode: Mapped[str] = mapped_column(CleanString(32))
    status: Mapped[str] = mapped_column(CleanString(32))
    reason: Mapped[str | None] = mapped_column(CleanText)
    samples_ms: Mapped[list[Any] | Unreadable] = mapped_column(Latencies, default=list)
    median_ms: Mapped[float | Unreadable | None] = mapped_column(Latency)
    floor_ms: Mapped[float | Unreadable | None] = mapped_column(Number)
    compile_s: Mapped[float | Unreadable | None] = mapped_column(Number)
    peak_mem_bytes: Mapped[int | None] = mapped_column(BigInteger)
    kernels_in_graphs: Mapped[int | None] = mapped_column(Integer)
    kernel_launches: Mapped[int | None] = mapped_column(Integer)
    graph_launches: Mapped[int | None] = mapped_column(Integer)
    copy_bytes_per_replay: Mapped[int | None] = mapped_column(BigInteger)
    details: Mapped[dict[str, Any] | Unreadable] = mapped_column(JSONObject, default=dict)

    run: Mapped[Run] = relationship(back_populates="performance")
    workload: Mapped[Workload] = relationship()


class PIStageResult(_RunResult, Base):
    __tablename__ = "pi_stage_results"
    __table_args__ = (UniqueConstraint("run_pk", "record_key"),)

    subject: Mapped[str] = mapped_column(CleanString(255))
    stage: Mapped[str] = mapped_column(CleanString(32))
    status: Mapped[str] = mapped_column(CleanString(16))
    message: Mapped[str] = mapped_column(CleanText, default="")
    triton_version: Mapped[str | None] = mapped_column(CleanString(64))
    details: Mapped[dict[str, Any] | Unreadable] = mapped_column(JSONObject, default=dict)

    run: Mapped[Run] = relationship(back_populates="pi_stages")


class Diagnostic(_RunResult, Base):
    __tablename__ = "diagnostics"
    __table_args__ = (UniqueConstraint("run_pk", "record_key"),)

    workload_pk: Mapped[int] = mapped_column(ForeignKey("workloads.id"), index=True)
    mode: Mapped[str] = mapped_column(CleanString(32))
    code: Mapped[str] = mapped_column(CleanString(64))
    node: Mapped[str] = mapped_column(CleanText, default="")
    source: Mapped[str] = mapped_column(CleanText, default="")
    message: Mapped[str] = mapped_column(CleanText, default="")
    transformed: Mapped[bool] = mapped_column(default=False)
    effect: Mapped[str] = mapped_column(CleanString(32), default="")  # disables_graphs | splits_graph | ...

    run: Mapped[Run] = relationship(back_populates="diagnostics")
    workload: Mapped[Workload] = relationship()


class ExpectedStatus(Base):
    """An expected outcome loaded from expected.toml: FAIL/IMPROVED/XFAIL/FLAKY/MISSING are judged
    against these. ``cell_pattern`` is an fnmatch pattern over cell ids."""

    __tablename__ = "expected_statuses"
    __table_args__ = (UniqueConstraint("cell_pattern", "suite", "workload", "mode"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    cell_pattern: Mapped[str] = mapped_column(CleanString(128))
    suite: Mapped[str] = mapped_column(CleanString(32))  # correctness | performance | pi
    workload: Mapped[str] = mapped_column(CleanString(128))
    mode: Mapped[str] = mapped_column(CleanString(32))
    status: Mapped[str] = mapped_column(CleanString(32))
    flaky: Mapped[bool] = mapped_column(default=False)
    reason: Mapped[str] = mapped_column(CleanText, default="")


RESULT_TABLES = (TestOutcome, CorrectnessResult, PerformanceResult, PIStageResult, Diagnostic)


def checked_columns(model: type[Base]) -> tuple[Column[Any], ...]:
    """The columns of ``model`` whose stored values may read as ``Unreadable`` (``CHECKED_TYPES``)."""
    return tuple(c for c in cast(Table, model.__table__).columns if isinstance(c.type, CHECKED_TYPES))


def choice_columns(model: type[Base]) -> tuple[Column[Any], ...]:
    """The columns of ``model`` whose ``info`` declares the texts they take (``choices``); stored text
    outside them reads as unreadable where it is read (``matrix.unreadable.read_choice``)."""
    return tuple(c for c in cast(Table, model.__table__).columns if "choices" in c.info)


def choices(column: Column[Any]) -> frozenset[str]:
    """The texts a ``choice_columns`` column takes."""
    return frozenset(member.value for member in column.info["choices"])


def checked_values(row: Base) -> dict[str, object]:
    """The values of ``row``'s ``checked_columns``, by column name, as read."""
    return {c.key: getattr(row, c.key) for c in checked_columns(type(row))}
