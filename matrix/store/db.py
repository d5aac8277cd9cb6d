"""Engines and sessions for the results store.

One ``sessionmaker`` is built per store URL. The default store is an embedded SQLite file at
``$GRACE_MATRIX_HOME/store.sqlite`` (``GRACE_MATRIX_HOME`` defaults to ``.grace-matrix`` in the current
directory); ``--db URL`` or ``GRACE_MATRIX_DB`` selects any SQLAlchemy URL (PostgreSQL for fleets).

Invariants: callers open transactions at the edge (``with Session.begin():``) and pass sessions inward;
``open_store`` brings the schema to the current head before returning.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from matrix.store.models import Base

ENV_DB = "GRACE_MATRIX_DB"
ENV_HOME = "GRACE_MATRIX_HOME"


def default_url() -> str:
    """The store URL when none is given: ``GRACE_MATRIX_DB`` or the embedded SQLite file."""
    if url := os.environ.get(ENV_DB):
        return url
    home = Path(os.environ.get(ENV_HOME, ".grace-matrix"))
    return f"sqlite:///{(home / 'store.sqlite').resolve()}"


def make_engine(url: str | None = None) -> Engine:
    url = url or default_url()
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.close()

        return engine
    return create_engine(url)


def open_store(url: str | None = None) -> sessionmaker[Session]:
    """A session factory for the store at ``url``, with the schema created or upgraded."""
    engine = make_engine(url)
    Base.metadata.create_all(engine)  # replaced by Alembic upgrade to head
    return sessionmaker(engine, expire_on_commit=False)
