"""The store's engine and schema: migrations reach the models, unusable stores give one clear error."""

from __future__ import annotations

import sqlite3

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from matrix.errors import StoreError
from matrix.store.db import SCHEMA_VERSION, _alembic_config, default_url, open_store
from matrix.store.models import Base, Run


def test_schema_version_is_the_migrations_head() -> None:
    assert ScriptDirectory.from_config(_alembic_config()).get_current_head() == SCHEMA_VERSION


def test_migrations_build_exactly_the_models(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    open_store(url)
    engine = create_engine(url)
    with engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_revision() == SCHEMA_VERSION
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []


def test_reopening_is_cheap_and_keeps_data(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    Session = open_store(url)
    with Session.begin() as s:
        s.execute(
            text(
                "INSERT INTO cells (fingerprint, cell_id, kind, python_version, platform, extra) "
                "VALUES ('f', 'c', 'current', '3.11', 'Linux', '{}')"
            )
        )
    with open_store(url)() as s:
        assert s.execute(text("SELECT count(*) FROM cells")).scalar() == 1


def test_store_built_without_migrations_is_adopted(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    Base.metadata.create_all(create_engine(url))
    Session = open_store(url)
    with Session() as s:
        assert s.query(Run).count() == 0
    with create_engine(url).connect() as connection:
        assert MigrationContext.configure(connection).get_current_revision() == SCHEMA_VERSION


@pytest.mark.parametrize(
    "content", [b"this is not a database at all" * 50, b"SQLite format 3\x00" + b"\xff" * 4000]
)
def test_corrupt_store_gives_one_clear_error(tmp_path, content) -> None:
    path = tmp_path / "store.sqlite"
    path.write_bytes(content)
    with pytest.raises(StoreError) as info:
        open_store(f"sqlite:///{path}")
    message = str(info.value)
    assert str(path) in message and "not a readable SQLite database" in message
    assert "move the file aside" in message and "\n" not in message


def test_store_from_a_newer_version_is_refused(tmp_path) -> None:
    path = tmp_path / "store.sqlite"
    open_store(f"sqlite:///{path}")
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(StoreError, match=r"revision '9999'.*newer version; upgrade grace-matrix"):
        open_store(f"sqlite:///{path}")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("not a url", "is not a database URL"),
        ("nosuchdb://x/y", "no SQLAlchemy dialect"),
        # refused by the server here, or by the missing driver where psycopg is not installed
        ("postgresql+psycopg://user:secret@127.0.0.1:9/db", "cannot use store|driver .* is not installed"),
    ],
)
def test_unusable_urls_give_one_clear_error(url, problem) -> None:
    with pytest.raises(StoreError, match=problem) as info:
        open_store(url)
    assert "secret" not in str(info.value)


def test_default_url_from_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("GRACE_MATRIX_DB", raising=False)
    monkeypatch.setenv("GRACE_MATRIX_HOME", str(tmp_path / "home"))
    assert default_url() == f"sqlite:///{tmp_path / 'home' / 'store.sqlite'}"
    monkeypatch.setenv("GRACE_MATRIX_DB", "sqlite:///elsewhere.sqlite")
    assert default_url() == "sqlite:///elsewhere.sqlite"


def test_in_memory_store_shares_one_database() -> None:
    Session = open_store("sqlite://")
    with Session() as s:
        assert "runs" in inspect(s.get_bind()).get_table_names()
