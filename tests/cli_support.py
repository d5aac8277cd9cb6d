"""Test support for the command line: what a failed command printed on stderr, the run line of a
hand-made export, such an export with its rows, and an empty store every command uses by default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from matrix.store.db import open_store


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one non-empty line a failed command printed on stderr (and no traceback)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def export_run_line(uid: str = "00000000-0000-0000-0000-000000000001", **cell: object) -> dict[str, object]:
    """A valid run line of an export (its cell's fields replaced by ``cell``)."""
    return {
        "type": "run",
        "uid": uid,
        "status": "complete",
        "started_at": "2026-11-29T10:00:00+00:00",
        "cell": {
            "fingerprint": "f" * 64,
            "cell_id": "torch-2.11",
            "kind": "venv",
            "python_version": "3.12",
            "platform": "linux",
            "extra": {},
            **cell,
        },
    }


def empty_store_in(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A new empty store in ``folder``, the default of every command (GRACE_MATRIX_DB), run from
    ``folder`` (no expected.toml, no matrix.toml: nothing but the store)."""
    path = folder / "store.sqlite"
    monkeypatch.setenv("GRACE_MATRIX_DB", f"sqlite:///{path}")
    monkeypatch.chdir(folder)
    open_store(f"sqlite:///{path}").kw["bind"].dispose()
    return path


def export_file(path: Path, uid: str, run: dict[str, object] | None = None, *rows: dict[str, object]) -> Path:
    """A hand-made export at ``path``: its header, run ``uid`` (fields replaced by ``run``), ``rows``."""
    header = {"format": "grace-matrix-export", "version": 1, "schema": "0002"}
    items = [header, {**export_run_line(uid), **(run or {})}, *({"run": uid, **row} for row in rows)]
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


def outcome_row(outcome: str, key: str = "suites/test_a.py::test_a") -> dict[str, object]:
    """A ``test_outcomes`` row of an export."""
    return {"type": "test_outcomes", "record_key": key, "nodeid": key, "outcome": outcome}
