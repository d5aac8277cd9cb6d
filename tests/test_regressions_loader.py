"""The loader reads rows in recording order: when one run holds a key twice, the later record wins.

PostgreSQL returns the rows of an unordered join in whatever order its plan yields; SQLite usually in
rowid order. SQLite's ``reverse_unordered_selects`` pragma reverses every select that has no ORDER BY,
so these tests fail if a loader query relies on the backend's unasked order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from matrix.regressions import loader
from matrix.regressions.observations import ResultKey, Suite
from matrix.regressions.synthetic import SyntheticSpec, seed_history
from matrix.store.db import open_store
from matrix.store.models import CorrectnessResult, PerformanceResult, PIStageResult, Run, Workload

SPEC = SyntheticSpec(nights=1, workloads=("xlnet_lm", "mt5"), pi_subjects=("triton_poi_fused_add_0",))


def _copy(model: Any, row: Any, **changes: Any) -> Any:
    data = {c.key: getattr(row, c.key) for c in model.__table__.columns if c.key != "id"}
    return model(**{**data, "record_key": f"{row.record_key}#later", **changes})


@pytest.fixture
def store(tmp_path: Path) -> tuple[sessionmaker[Session], int]:
    """A one-night store whose first run records each kind of row twice; the second copy differs."""
    factory = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    engine = factory.kw["bind"]

    @event.listens_for(engine, "connect")
    def _reverse(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA reverse_unordered_selects = ON")

    engine.dispose()  # new connections get the pragma
    with factory.begin() as session:
        seed_history(session, SPEC)
        run_pk = session.scalars(select(Run.id).order_by(Run.id)).first()
        assert run_pk is not None
        perf = session.scalars(
            select(PerformanceResult).where(PerformanceResult.run_pk == run_pk).order_by(PerformanceResult.id)
        ).first()
        correct = session.scalars(
            select(CorrectnessResult).where(CorrectnessResult.run_pk == run_pk).order_by(CorrectnessResult.id)
        ).first()
        pi = session.scalars(
            select(PIStageResult).where(PIStageResult.run_pk == run_pk).order_by(PIStageResult.id)
        ).first()
        assert perf is not None and correct is not None and pi is not None
        session.add_all(
            [
                _copy(PerformanceResult, perf, samples_ms=[7.0, 7.0, 7.0], median_ms=7.0),
                _copy(CorrectnessResult, correct, status="fail_accuracy"),
                _copy(PIStageResult, pi, status="fail"),
            ]
        )
    return factory, run_pk


def _perf_key(session: Session, run_pk: int) -> tuple[str, str]:
    row = session.execute(
        select(Workload.name, PerformanceResult.mode)
        .join(Workload, PerformanceResult.workload_pk == Workload.id)
        .where(PerformanceResult.run_pk == run_pk)
        .order_by(PerformanceResult.id.desc())
    ).first()
    assert row is not None
    return row[0], row[1]


def test_the_pragma_reverses_unordered_selects(store: tuple[sessionmaker[Session], int]) -> None:
    factory, run_pk = store
    with factory() as session:
        ids = list(session.scalars(select(PerformanceResult.id).where(PerformanceResult.run_pk == run_pk)))
    assert ids == sorted(ids, reverse=True), "the fixture would not catch an order-reliant query"


def test_the_later_performance_record_wins(store: tuple[sessionmaker[Session], int]) -> None:
    factory, run_pk = store
    with factory() as session:
        key = _perf_key(session, run_pk)
        assert loader.load_perf_samples(session, [run_pk])[run_pk][key].median_ms == 7.0
        assert loader.load_perf_medians(session, [run_pk])[run_pk][key] == 7.0
        assert loader.load_perf_medians(session)[run_pk][key] == 7.0


def test_the_later_status_wins(store: tuple[sessionmaker[Session], int]) -> None:
    factory, run_pk = store
    with factory() as session:
        name, mode = session.execute(
            select(Workload.name, CorrectnessResult.mode)
            .join(Workload, CorrectnessResult.workload_pk == Workload.id)
            .where(CorrectnessResult.run_pk == run_pk)
            .order_by(CorrectnessResult.id.desc())
            .limit(1)
        ).one()
        subject, stage = session.execute(
            select(PIStageResult.subject, PIStageResult.stage)
            .where(PIStageResult.run_pk == run_pk)
            .order_by(PIStageResult.id.desc())
            .limit(1)
        ).one()
        statuses = {o.key: o.status for o in loader.load_observations(session, [run_pk])[run_pk]}
        pi_rows = {(r.subject, r.stage): r.status for r in loader.load_pi_rows(session, [run_pk])}
    assert statuses[ResultKey(Suite.CORRECTNESS, name, mode)] == "fail_accuracy"
    assert statuses[ResultKey(Suite.PI, subject, stage)] == "fail"
    assert pi_rows[(subject, stage)] == "fail"


def test_an_unordered_copy_of_the_query_would_lose(store: tuple[sessionmaker[Session], int]) -> None:
    """The witness: the same select without ORDER BY returns the earlier record last under the pragma."""
    factory, run_pk = store
    with factory() as session:
        medians = [
            m
            for (m,) in session.execute(
                select(PerformanceResult.median_ms).where(PerformanceResult.run_pk == run_pk)
            )
        ]
    assert medians[0] == 7.0 and medians[-1] != 7.0
