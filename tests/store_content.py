"""Test support: throwaway PostgreSQL databases, and a store's content keyed by names, not integer ids.

``fresh_database`` creates a database on the server of ``GRACE_MATRIX_TEST_PG_URL`` (see .ci/postgres.sh)
and drops it afterwards, so tests never see each other's rows. ``store_content`` reads every row of a
store into a dict keyed by what identifies it in any store (run uid, table, record key; cell
fingerprint; workload name and code hash), with integer ids replaced by those names and datetimes
normalised to UTC, so two stores on different databases can be compared with ``==``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from matrix.fingerprint import Environment
from matrix.store.db import open_store
from matrix.store.models import RESULT_TABLES, Cell, Run, Workload

PG_ENV = "GRACE_MATRIX_TEST_PG_URL"
_IDS = {"id", "run_pk", "cell_pk", "workload_pk"}


def environment(cell_id: str, gpu: str | None = "NVIDIA H200", **fields: Any) -> Environment:
    """A cell's environment for store tests: torch 2.11 / Triton 3.6 / CUDA 13.0 on ``gpu`` (None: no
    GPU), any field overridden by ``fields``."""
    values: dict[str, Any] = {
        "cell_id": cell_id,
        "kind": "venv",
        "torch_version": "2.11.0",
        "triton_version": "3.6.0",
        "cuda_runtime": "13.0",
        "driver_version": "580.65",
        "gpu_name": gpu,
        "gpu_capability": "9.0" if gpu else None,
        "python_version": "3.12.8",
        "platform": "Linux-x86_64-glibc2.36",
        "extra": {},
    }
    values.update(fields)
    return Environment(**values)


def pg_base_url() -> str:
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"needs a PostgreSQL server: set {PG_ENV} (.ci/postgres.sh start DIR prints one)")
    return url


@contextlib.contextmanager
def fresh_database(base_url: str) -> Iterator[str]:
    """A new, empty database on the server of ``base_url``; dropped on exit."""
    name = f"grace_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(base_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
        return aware.astimezone(dt.timezone.utc).isoformat()
    return value


def _fields(row: Any, drop: Iterable[str] = ()) -> dict[str, Any]:
    skip = _IDS | set(drop)
    return {c.key: _plain(getattr(row, c.key)) for c in row.__table__.columns if c.key not in skip}


def store_content(
    url: str, labels: Iterable[str] | None = None, drop: Iterable[str] = ()
) -> dict[tuple[str, ...], dict[str, Any]]:
    """Every run (optionally only those with ``labels``), its cell and its result rows, keyed by name.

    Keys: ("run", uid), ("cell", uid) and (table, uid, record_key); ``drop`` leaves out fields that
    legitimately differ between two executions (times, pids) when comparing different runs.
    """
    Session = open_store(url)
    wanted = None if labels is None else set(labels)
    content: dict[tuple[str, ...], dict[str, Any]] = {}
    try:
        with Session() as session:
            workloads = {
                w.id: (w.name, w.code_hash, w.tier, tuple(w.tags)) for w in session.scalars(select(Workload))
            }
            for run in session.scalars(select(Run)):
                if wanted is not None and run.label not in wanted:
                    continue
                content[("run", run.uid)] = _fields(run, drop)
                content[("cell", run.uid)] = _fields(session.get_one(Cell, run.cell_pk), drop)
                for model in RESULT_TABLES:
                    for row in session.scalars(select(model).where(model.run_pk == run.id)):
                        fields = _fields(row, drop)
                        if hasattr(row, "workload_pk"):
                            fields["workload"] = workloads[row.workload_pk]
                        key = (model.__tablename__, run.uid, row.record_key)
                        assert key not in content, f"duplicate row {key}"
                        content[key] = fields
    finally:
        Session.kw["bind"].dispose()
    return content


def by_cell(content: dict[tuple[str, ...], dict[str, Any]]) -> dict[tuple[str, ...], dict[str, Any]]:
    """Re-key ``store_content`` by cell id instead of run uid, to compare two runs of the same cells."""
    cell_of = {key[1]: fields["cell_id"] for key, fields in content.items() if key[0] == "cell"}
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for key, fields in content.items():
        new_key = (key[0], cell_of[key[1]], *key[2:])
        out[new_key] = {k: v for k, v in fields.items() if k not in ("uid", "label")}
    return out
