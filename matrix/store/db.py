"""Engines and sessions for the results store.

Problem: the store is opened by the CLI, by the recording plugin and by nox sessions, on SQLite files
that may have been written by an older grace-matrix, copied from another machine or damaged, and on
PostgreSQL servers that several cells write to at once. Each of them must end up on the current schema,
and a store that cannot be used must say so in one line instead of a traceback deep in a test run.

Design: one ``sessionmaker`` is built per store URL. The default store is an embedded SQLite file at
``$GRACE_MATRIX_HOME/store.sqlite`` (``GRACE_MATRIX_HOME`` defaults to ``.grace-matrix`` in the current
directory); ``--db URL`` or ``GRACE_MATRIX_DB`` selects any SQLAlchemy URL (PostgreSQL for fleets).
``open_store`` checks the Alembic revision and upgrades to head when needed, under a lock (a lock file
beside a SQLite store, an advisory lock on PostgreSQL) so that concurrent openers do not race. The
caller says how it uses the store (``StoreAccess``): read commands never create a store, merge sources
are opened read-only, and a SQLite file that fails its integrity check is never written.

Invariants: callers open transactions at the edge (``with Session.begin():``) and pass sessions inward;
``open_store`` returns only for a store at ``SCHEMA_VERSION``; every failure to get there is a
``StoreError`` naming the store and the fix.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import sqlite3
import time
import urllib.parse
import zlib
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    DatabaseError,
    IntegrityError,
    NoSuchModuleError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from matrix.errors import StoreError
from matrix.store.models import Base

logger = logging.getLogger(__name__)

ENV_DB = "GRACE_MATRIX_DB"
ENV_HOME = "GRACE_MATRIX_HOME"
SCHEMA_VERSION = "0002"
"""The Alembic head revision this code reads and writes."""

_MIGRATIONS = "matrix:migrations"
_PG_LOCK_KEY = zlib.crc32(b"grace-matrix schema upgrade")


BUSY_TIMEOUT_S = 60.0  # how long a SQLite connection waits for another writer before "database is locked"


def default_url() -> str:
    """The store URL when none is given: ``GRACE_MATRIX_DB`` or the embedded SQLite file."""
    if url := os.environ.get(ENV_DB):
        return url
    home = Path(os.environ.get(ENV_HOME, ".grace-matrix"))
    return f"sqlite:///{(home / 'store.sqlite').resolve()}"


def display_url(url: str) -> str:
    """The URL with any password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL; None for in-memory SQLite and other databases."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


class StoreAccess(enum.Enum):
    """How a command uses a store (see ``open_store``)."""

    CREATE = "create"  # writers (record, ingest, merge into): a missing store is created
    EXISTING = "existing"  # read commands: a missing store is an error; an older schema is upgraded
    READ_ONLY = "read-only"  # merge sources: opened read-only, never migrated, never written


def make_engine(url: str | None = None, access: StoreAccess = StoreAccess.CREATE) -> Engine:
    url = url or default_url()
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(
            f"{url!r} is not a database URL; expected e.g. sqlite:///path/store.sqlite or "
            "postgresql+psycopg://user@host/db"
        ) from None
    try:
        if parsed.get_backend_name() != "sqlite":
            if access is StoreAccess.READ_ONLY and parsed.get_backend_name() == "postgresql":
                read_only = {"options": "-c default_transaction_read_only=on"}
                return create_engine(url, pool_pre_ping=True, connect_args=read_only)
            return create_engine(url, pool_pre_ping=True)
        path = sqlite_path(url)
        if path is None:  # in-memory: one connection shared, or every session sees an empty store
            engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
        elif path.is_dir():
            raise StoreError(
                f"store {path} is a folder, not a SQLite file; name a file in it with --db / {ENV_DB} "
                f"(e.g. sqlite:///{path / 'store.sqlite'})"
            )
        elif access is not StoreAccess.CREATE and not path.is_file():
            raise StoreError(
                f"no store at {path} (nothing was recorded or ingested there); check --db / {ENV_DB}, or "
                "create one with `grace-matrix ingest` or `nox -s matrix`"
            )
        elif access is StoreAccess.READ_ONLY:
            uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
            engine = create_engine(
                "sqlite://",
                creator=lambda: sqlite3.connect(
                    uri, uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False
                ),
            )
        else:
            _make_folder(path)
            engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})
    except NoSuchModuleError:
        raise StoreError(
            f"no SQLAlchemy dialect for {display_url(url)}; for PostgreSQL install grace-matrix[postgres]"
        ) from None
    except ModuleNotFoundError as exc:
        raise StoreError(
            f"the driver for {display_url(url)} is not installed ({exc.name}); "
            "for PostgreSQL install grace-matrix[postgres]"
        ) from None

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        if path is not None and access is not StoreAccess.READ_ONLY:
            _use_wal(cursor)  # readers never block the recording writer
            cursor.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; safe in WAL mode
        cursor.close()

    return engine


def _make_folder(path: Path) -> None:
    """The folder of a new SQLite store, made when missing; a ``StoreError`` when it cannot be (a file in
    its place, no permission), instead of the ``OSError`` a write would have shown as a traceback."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"cannot make the folder of store {path}: {exc.strerror or exc}"
            f"{f' ({exc.filename})' if exc.filename else ''}; check --db / {ENV_DB}"
        ) from None


def _use_wal(cursor: sqlite3.Cursor) -> None:
    """Switch a SQLite store to WAL mode. The switch takes an exclusive lock without SQLite's busy
    handler, so while another process holds a lock on a store not yet in WAL mode (several openers of a
    new store) it fails at once with 'database is locked': it is retried here until the busy timeout."""
    if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
        return
    deadline, pause = time.monotonic() + BUSY_TIMEOUT_S, 0.01
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def open_store(url: str | None = None, access: StoreAccess = StoreAccess.CREATE) -> sessionmaker[Session]:
    """A session factory for the store at ``url``, on the current schema.

    ``CREATE`` creates a missing store and upgrades an older one; ``EXISTING`` refuses a missing store
    (a SQLite file that does not exist, a database without our tables) and upgrades an older one; both
    refuse a SQLite store that fails ``PRAGMA quick_check``, since writing to it could lose more.
    ``READ_ONLY`` opens the store so that nothing can be written and refuses one not at
    ``SCHEMA_VERSION`` (a read-only store cannot be upgraded)."""
    url = url or default_url()
    engine = make_engine(url, access)
    try:
        with engine.connect() as connection:
            current = _current_revision(connection)
            if access is not StoreAccess.CREATE and current is None and not _has_all_tables(connection):
                raise StoreError(f"{display_url(url)} holds no grace-matrix store; {_remedy(access)}")
            if access is not StoreAccess.READ_ONLY:
                _check_integrity(url, connection)
        if current != SCHEMA_VERSION:
            _check_known(url, current)
            if access is StoreAccess.READ_ONLY:
                raise StoreError(
                    f"store {display_url(url)} is at schema revision {current!r}, not {SCHEMA_VERSION!r}, "
                    "and is opened read-only; upgrade it first by opening it for writing (e.g. "
                    "`grace-matrix summary --db URL`)"
                )
            with _upgrade_lock(engine, url):
                upgrade_to_head(engine)
    except StoreError:
        engine.dispose()
        raise
    except DatabaseError as exc:
        engine.dispose()
        raise StoreError(_database_problem(url, exc, access)) from None
    return sessionmaker(engine, expire_on_commit=False)


def _check_integrity(url: str, connection: Connection) -> None:
    """Refuse a damaged SQLite file for writing (``PRAGMA quick_check``)."""
    path = sqlite_path(url)
    if connection.dialect.name != "sqlite" or path is None:
        return
    rows = connection.exec_driver_sql("PRAGMA quick_check").fetchmany(3)
    lines = [line for row in rows for line in str(row[0]).splitlines() if not line.startswith("***")]
    if lines != ["ok"]:
        problems = lines[:2] + (["..."] if len(lines) > 2 else [])
        raise StoreError(
            f"store {path} fails SQLite's integrity check ({'; '.join(problems)}); refusing to write to it: "
            "restore it from a copy, or move it aside to start a new store"
        )


def upgrade_to_head(engine: Engine) -> None:
    """Run the Alembic migrations up to ``SCHEMA_VERSION`` (a store built before migrations is stamped)."""
    with engine.begin() as connection:
        current = _current_revision(connection)
        if current == SCHEMA_VERSION:
            return  # another process upgraded it while we waited for the lock
        config = _alembic_config()
        config.attributes["connection"] = connection
        if current is None and _has_all_tables(connection):
            # Built by create_all: it holds today's columns (stamp head) or, from an older
            # grace-matrix, the initial ones (stamp 0001 and let the migrations add the rest).
            adopted = SCHEMA_VERSION if _has_all_columns(connection) else "0001"
            logger.info("store has the tables but no revision; stamping %s", adopted)
            command.stamp(config, adopted)
        logger.info("upgrading store schema from %s to %s", current, SCHEMA_VERSION)
        command.upgrade(config, "head")


def _alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", _MIGRATIONS)
    return config


def _current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def _check_known(url: str, revision: str | None) -> None:
    if revision is None:
        return
    script = ScriptDirectory.from_config(_alembic_config())
    try:
        script.get_revision(revision)
    except Exception:
        raise StoreError(
            f"store {display_url(url)} is at schema revision {revision!r}, which this grace-matrix does not "
            f"know (its head is {SCHEMA_VERSION!r}): it was written by a newer version; upgrade grace-matrix"
        ) from None


def _has_all_tables(connection: Connection) -> bool:
    present = set(inspect(connection).get_table_names())
    return set(Base.metadata.tables) <= present


def _has_all_columns(connection: Connection) -> bool:
    inspector = inspect(connection)
    return all(
        {column.name for column in table.columns} <= {c["name"] for c in inspector.get_columns(name)}
        for name, table in Base.metadata.tables.items()
    )


@contextlib.contextmanager
def _upgrade_lock(engine: Engine, url: str) -> Iterator[None]:
    """Serialise schema upgrades between processes opening the same store."""
    path = sqlite_path(url)
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _PG_LOCK_KEY})
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _PG_LOCK_KEY})
                connection.commit()
        return
    if path is None:
        yield
        return
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX: SQLite's own locking has to do
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remedy(access: StoreAccess) -> str:
    """What to do about a store that cannot be used: a merge source is named on the command line."""
    if access is StoreAccess.READ_ONLY:
        return "name a grace-matrix store to merge from"
    return f"check --db / {ENV_DB}"


def _database_problem(url: str, exc: DatabaseError, access: StoreAccess = StoreAccess.CREATE) -> str:
    detail = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
    path = sqlite_path(url)
    if path is not None and ("not a database" in detail or "malformed" in detail):
        if access is StoreAccess.READ_ONLY:
            return f"merge source {path} is not a readable SQLite database ({detail}); {_remedy(access)}"
        return (
            f"store {path} is not a readable SQLite database ({detail}); move the file aside to start a "
            f"new store, or choose another with --db / {ENV_DB}"
        )
    return f"cannot use store {display_url(url)}: {detail}; {_remedy(access)}"


def locked_out(exc: SQLAlchemyError) -> bool:
    """Whether ``exc`` is SQLite's 'database is locked': another process holds a write on the store."""
    return isinstance(exc, OperationalError) and "database is locked" in str(getattr(exc, "orig", exc))


def describe_error(url: str, exc: SQLAlchemyError) -> str:
    """One line for a database error met after the store was opened (used by the CLI)."""
    if locked_out(exc):
        return (
            f"store {display_url(url)} is locked: another process (an ingest, a merge, a running suite) "
            f"kept a write on it past the {BUSY_TIMEOUT_S:.0f} s wait; nothing was written, try again when "
            "it ends"
        )
    if isinstance(exc, IntegrityError):  # the data broke a constraint: the store itself is fine
        detail = str(exc.orig).strip().splitlines()[0]
        return f"store {display_url(url)} refused a row: {detail}; the input conflicts with what it holds"
    if isinstance(exc, DatabaseError):
        return _database_problem(url, exc)
    return f"store {display_url(url)}: {str(exc).splitlines()[0]}"
