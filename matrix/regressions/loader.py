"""Read what regression detection and the dashboards need from the results store, and nothing else.

Problem: the store can hold hundreds of thousands of results; building an ORM object per row (and
decoding every raw-sample array) would make the morning dashboard slow.

Design: column selects (SQLAlchemy Core through the session) into the plain values of
``matrix.regressions.observations``; the runs themselves come from ``matrix.readmodel``. Raw samples are
decoded only for the runs being compared; history uses the stored median (computed from the samples only for
rows that lack one).

Invariants: read-only; callers own the session and its transaction. Rows are read in the order they
were recorded (primary key), so when one run holds a key twice the later record wins, whatever order
the backend would return them in unasked (PostgreSQL and SQLite differ). A row holding a value that reads
as ``Unreadable`` (``matrix.unreadable``) is observed ``UNREADABLE``, a failure whose message names the
value, and gives no latency to compare.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from matrix.regressions.observations import (
    EMPTY_RUN,
    NO_TESTS_EXIT,
    PASSING_STATUS,
    RUN_SUBJECT,
    TEST_MODE,
    Observation,
    PerfSample,
    ResultKey,
    Suite,
)
from matrix.regressions.pairwise import PerfKey
from matrix.regressions.status import Expectation
from matrix.statuses import ResultStatus, row_status
from matrix.store.models import (
    CorrectnessResult,
    ExpectedStatus,
    PerformanceResult,
    PIStageResult,
    Run,
    RunStatus,
    TestOutcome,
    Workload,
    checked_columns,
    choices,
)
from matrix.unreadable import Unreadable, describe, read_choice

_CHUNK = 500  # bound the number of bound parameters of one IN (...)


def _chunks(values: Collection[int]) -> Iterable[list[int]]:
    items = sorted(values)
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def load_observations(session: Session, run_pks: Collection[int]) -> dict[int, list[Observation]]:
    """Status of every correctness, performance and PI result of the given runs, and their pytest
    outcomes and ends as the ``tests`` suite (Note: [Every outcome reaches a verdict])."""
    found: dict[int, list[Observation]] = defaultdict(list)
    for chunk in _chunks(run_pks):
        for model, suite in ((CorrectnessResult, Suite.CORRECTNESS), (PerformanceResult, Suite.PERFORMANCE)):
            checked = checked_columns(model)
            stmt = (
                select(
                    model.run_pk,
                    Workload.name,
                    model.mode,
                    model.status,
                    model.nodeid,
                    model.reason,
                    *checked,
                )
                .join(Workload, model.workload_pk == Workload.id)
                .where(model.run_pk.in_(chunk))
                .order_by(model.id)
            )
            for run_pk, name, mode, status, nodeid, reason, *values in session.execute(stmt):
                key = ResultKey(suite, name, mode)
                found[run_pk].append(_observation(key, status, nodeid, reason, checked, values))
        checked = checked_columns(PIStageResult)
        pi = (
            select(
                PIStageResult.run_pk,
                PIStageResult.subject,
                PIStageResult.stage,
                PIStageResult.status,
                PIStageResult.nodeid,
                PIStageResult.message,
                *checked,
            )
            .where(PIStageResult.run_pk.in_(chunk))
            .order_by(PIStageResult.id)
        )
        for run_pk, subject, stage, status, nodeid, message, *values in session.execute(pi):
            key = ResultKey(Suite.PI, subject, stage)
            found[run_pk].append(_observation(key, status, nodeid, message, checked, values))
        _load_test_observations(session, chunk, found)
    return dict(found)


def _load_test_observations(session: Session, chunk: list[int], found: dict[int, list[Observation]]) -> None:
    """The ``tests`` suite (Note: [Every outcome reaches a verdict]): every pytest outcome, and the end
    of every run that finished other than ``complete``."""
    checked = checked_columns(TestOutcome)
    outcome_column = cast(Table, TestOutcome.__table__).c.outcome
    written = choices(outcome_column)
    read_columns = (*checked, outcome_column)
    outcomes = (
        select(
            TestOutcome.run_pk,
            TestOutcome.record_key,
            TestOutcome.outcome,
            TestOutcome.nodeid,
            TestOutcome.message,
            *checked,
        )
        .where(TestOutcome.run_pk.in_(chunk))
        .order_by(TestOutcome.id)
    )
    for run_pk, record_key, outcome, nodeid, message, *values in session.execute(outcomes):
        key = ResultKey(Suite.TESTS, record_key, TEST_MODE)
        read = (*values, read_choice(outcome, written))  # an outcome no writer records: unreadable
        found[run_pk].append(_observation(key, outcome, nodeid or record_key, message, read_columns, read))
    silent = (RunStatus.COMPLETE.value, RunStatus.RUNNING.value)  # no verdict of the run itself
    runs = select(Run.id, Run.status, Run.message).where(Run.id.in_(chunk), Run.status.not_in(silent))
    key = ResultKey(Suite.TESTS, RUN_SUBJECT, TEST_MODE)
    for run_pk, status, message in session.execute(runs):
        ended = RunStatus.read(status)
        if ended is RunStatus.UNREADABLE:
            message = f"unreadable stored value: status holds {status!r}, not a run status"
        found[run_pk].append(Observation(key, _status(ended.value), "", message or f"the run ended {status}"))
    # A complete run whose pytest collected nothing ran no test: it proves nothing, so it is never green.
    empty = select(Run.id).where(
        Run.id.in_(chunk), Run.status == RunStatus.COMPLETE.value, Run.exit_code == NO_TESTS_EXIT
    )
    for (run_pk,) in session.execute(empty):
        found[run_pk].append(Observation(key, ResultStatus.FAILED, "", EMPTY_RUN))


def _status(text: str | None, *values: object) -> ResultStatus:
    """The stored status as the detectors judge it (unknown or missing text: ``OTHER``; a row holding an
    unreadable value: ``UNREADABLE``; both failures)."""
    return row_status(text, *values) or ResultStatus.OTHER


def _observation(
    key: ResultKey,
    status: str | None,
    nodeid: str | None,
    message: str | None,
    checked: Sequence[Any],
    values: Sequence[object],
) -> Observation:
    """A result row as the detectors judge it; ``values`` are those of its ``checked`` columns."""
    unreadable = describe({column.key: value for column, value in zip(checked, values, strict=True)})
    return Observation(key, _status(status, *values), nodeid or "", unreadable or message or "")


def _median(samples: Any) -> float | None:
    """The median of stored samples; None for none (or an unreadable list: its row is observed failed)."""
    if isinstance(samples, Unreadable) or not samples:
        return None
    return statistics.median(float(v) for v in samples)


def load_perf_samples(session: Session, run_pks: Collection[int]) -> dict[int, dict[PerfKey, PerfSample]]:
    """Raw samples of the successful performance results of the given runs."""
    ok = PASSING_STATUS[Suite.PERFORMANCE]
    found: dict[int, dict[PerfKey, PerfSample]] = defaultdict(dict)
    for chunk in _chunks(run_pks):
        stmt = (
            select(
                PerformanceResult.run_pk,
                Workload.name,
                Workload.code_hash,
                PerformanceResult.mode,
                PerformanceResult.samples_ms,
                PerformanceResult.median_ms,
                PerformanceResult.nodeid,
            )
            .join(Workload, PerformanceResult.workload_pk == Workload.id)
            .where(PerformanceResult.run_pk.in_(chunk), PerformanceResult.status == ok)
            .order_by(PerformanceResult.id)
        )
        for run_pk, name, code_hash, mode, samples, median, nodeid in session.execute(stmt):
            if isinstance(samples, Unreadable) or isinstance(median, Unreadable):
                continue  # observed UNREADABLE (``load_observations``): nothing to compare
            values = tuple(float(v) for v in samples or ())
            median = median if median is not None else _median(values)
            if median is None:
                continue
            found[run_pk][(name, mode)] = PerfSample(
                name, mode, values, float(median), nodeid or "", code_hash
            )
    return dict(found)


def load_perf_medians(
    session: Session, run_pks: Collection[int] | None = None
) -> dict[int, dict[PerfKey, float]]:
    """Median latency of every successful performance result (of the given runs, default all)."""
    ok = PASSING_STATUS[Suite.PERFORMANCE]
    found: dict[int, dict[PerfKey, float]] = defaultdict(dict)
    base = (
        select(
            PerformanceResult.id,
            PerformanceResult.run_pk,
            Workload.name,
            PerformanceResult.mode,
            PerformanceResult.median_ms,
        )
        .join(Workload, PerformanceResult.workload_pk == Workload.id)
        .where(PerformanceResult.status == ok)
        .order_by(PerformanceResult.id)
    )
    groups: Iterable[list[int] | None] = [None] if run_pks is None else _chunks(run_pks)
    lacking: list[int] = []
    where: dict[int, tuple[int, PerfKey]] = {}
    for chunk in groups:
        stmt = base if chunk is None else base.where(PerformanceResult.run_pk.in_(chunk))
        for pk, run_pk, name, mode, median in session.execute(stmt):
            if median is None:
                lacking.append(pk)
                where[pk] = (run_pk, (name, mode))
            elif not isinstance(median, Unreadable):  # an unreadable one is observed UNREADABLE
                found[run_pk][(name, mode)] = float(median)
    for chunk in _chunks(lacking):
        stmt2 = select(PerformanceResult.id, PerformanceResult.samples_ms).where(
            PerformanceResult.id.in_(chunk)
        )
        for pk, samples in session.execute(stmt2):
            median = _median(samples)
            if median is not None:
                run_pk, key = where[pk]
                found[run_pk][key] = median
    return dict(found)


def load_expectations(session: Session) -> list[Expectation]:
    rows = session.execute(select(ExpectedStatus).order_by(ExpectedStatus.id)).scalars()
    return [
        Expectation(
            cell_pattern=row.cell_pattern,
            suite=Suite(row.suite),
            workload=row.workload,
            mode=row.mode,
            status=row.status,
            flaky=row.flaky,
            reason=row.reason,
        )
        for row in rows
    ]


def load_outcomes(session: Session, run_pks: Collection[int]) -> dict[int, dict[str, str]]:
    """pytest outcome (passed, failed, skipped, error, crashed) per record key, per run."""
    found: dict[int, dict[str, str]] = defaultdict(dict)
    for chunk in _chunks(run_pks):
        stmt = (
            select(TestOutcome.run_pk, TestOutcome.record_key, TestOutcome.outcome)
            .where(TestOutcome.run_pk.in_(chunk))
            .order_by(TestOutcome.id)
        )
        for run_pk, record_key, outcome in session.execute(stmt):
            found[run_pk][record_key] = outcome
    return dict(found)


def load_perf_keys(session: Session, run_pks: Collection[int]) -> dict[int, set[PerfKey]]:
    """The workload x mode of every performance result of the given runs, whatever its status."""
    found: dict[int, set[PerfKey]] = defaultdict(set)
    for chunk in _chunks(run_pks):
        stmt = (
            select(PerformanceResult.run_pk, Workload.name, PerformanceResult.mode)
            .join(Workload, PerformanceResult.workload_pk == Workload.id)
            .where(PerformanceResult.run_pk.in_(chunk))
        )
        for run_pk, name, mode in session.execute(stmt):
            found[run_pk].add((name, mode))
    return dict(found)


@dataclass(frozen=True)
class PIRow:
    run_pk: int
    subject: str
    stage: str
    status: ResultStatus
    message: str
    triton_version: str | None
    nodeid: str
    details: dict[str, Any] = field(default_factory=dict)


def load_pi_rows(session: Session, run_pks: Collection[int]) -> list[PIRow]:
    rows: list[PIRow] = []
    for chunk in _chunks(run_pks):
        stmt = (
            select(
                PIStageResult.run_pk,
                PIStageResult.subject,
                PIStageResult.stage,
                PIStageResult.status,
                PIStageResult.message,
                PIStageResult.triton_version,
                PIStageResult.nodeid,
                PIStageResult.details,
            )
            .where(PIStageResult.run_pk.in_(chunk))
            .order_by(PIStageResult.id)
        )
        for run_pk, subject, stage, status, message, triton, nodeid, details in session.execute(stmt):
            rows.append(
                PIRow(
                    run_pk,
                    subject,
                    stage,
                    _status(status, details),
                    describe({"details": details}) or message or "",
                    triton,
                    nodeid or "",
                    dict(details) if isinstance(details, dict) else {},
                )
            )
    return rows
