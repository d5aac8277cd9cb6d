"""Alembic environment of the results store.

``matrix.store.db.upgrade_to_head`` runs the migrations programmatically and hands its open connection
over in ``config.attributes["connection"]``; the ``alembic`` command line (``alembic -c
matrix/alembic.ini ...``, used to write new revisions) gives a URL in ``sqlalchemy.url`` instead.
SQLite needs batch mode for ALTER TABLE, so it is always on.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from matrix.store.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url (alembic -x or alembic.ini) or pass a connection")
    with create_engine(url).connect() as conn:
        _configure(conn)


if context.is_offline_mode():
    run_offline()
else:
    run_online()
