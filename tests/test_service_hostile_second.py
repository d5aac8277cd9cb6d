"""Hostile input for the service, a second probe: each test is one finding.

One export holding two different rows for one record of a run, of which ingest silently kept the first
(a failed test stored as passed, the cell green); two cells whose runs' uids share their first eight
characters, which shared one comparison page (the second written over the first); a run whose every
test was skipped, green in the grid's pytest column; a configuration file whose ``format`` is no version
(``true``, ``0``, ``1.0``) read as version 1 or called newer; a finished run's row brought again with
other values, counted 'already present' and dropped; a store another process keeps locked, which ingest
waited out five times over before its error.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_support import export_file, export_run_line, one_error_line, outcome_row

from matrix_cli.main import main

UID = "00000000-0000-0000-0000-0000000000dd"


def _export(path: Path, run: dict[str, object] | None = None, *rows: dict[str, object]) -> Path:
    return export_file(path, UID, run, *rows)


_outcome = outcome_row


# -- 1. two different rows for one record in one export ------------------------------------------------


def test_an_export_with_two_different_rows_for_one_record_is_refused(store, tmp_path, capsys) -> None:
    """The second row was counted 'already present' and dropped: the failed copy of the test was lost
    and the cell was green."""
    path = _export(tmp_path / "twice.jsonl", None, _outcome("passed"), _outcome("failed"))
    before = store.read_bytes()
    capsys.readouterr()
    assert main(["ingest", str(path)]) == 2
    line = one_error_line(capsys)
    assert f"{path}:4: test_outcomes row 'suites/test_a.py::test_a' of run {UID}" in line
    assert f"differs from the one at {path}:3" in line
    assert store.read_bytes() == before


def test_an_export_repeating_a_row_as_it_is_is_ingested_once(store, tmp_path, capsys) -> None:
    path = _export(tmp_path / "same.jsonl", None, _outcome("failed"), _outcome("failed"))
    assert main(["ingest", "--json", str(path)]) == 0
    stats = json.loads(capsys.readouterr().out)[str(path)]
    assert stats["rows_added"] == {"test_outcomes": 1} and stats["rows_present"] == {"test_outcomes": 1}


def test_two_copies_of_a_run_in_one_file_are_still_its_copies(store, tmp_path, capsys) -> None:
    """A running copy followed by the finished one (two exports concatenated): the finished copy's rows
    replace the running copy's, as when they are ingested one after the other."""
    running = _export(tmp_path / "a.jsonl", {"status": "running"}, _outcome("passed"))
    done = _export(tmp_path / "b.jsonl", None, _outcome("error"))
    both = tmp_path / "both.jsonl"
    both.write_text(running.read_text() + done.read_text(), encoding="utf-8")
    assert main(["ingest", str(both)]) == 0
    capsys.readouterr()
    assert main(["summary", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["outcomes"] == {"error": 1}


# -- 2. run uids that share their first characters --------------------------------------------------


def test_each_cell_has_its_own_comparison_page_whatever_its_run_uids(store, tmp_path, capsys) -> None:
    """A comparison page was named by the first eight characters of its two runs' uids: two cells whose
    runs' uids share them (``nightly-...``) got one page, the second cell's comparison written over the
    first's, and both links on compare.html opened it."""
    for cell in ("torch-2.11", "torch-2.13"):
        for hour in (10, 11):
            uid = f"nightly-{hour}-{cell}"
            path = _export(tmp_path / f"{uid}.jsonl", {"started_at": f"2026-11-29T{hour}:00:00+00:00"})
            run = {**export_run_line(uid, cell_id=cell, fingerprint=cell[-1] * 64)}
            run["started_at"] = f"2026-11-29T{hour}:00:00+00:00"
            header, _ = path.read_text().splitlines()
            path.write_text(f"{header}\n{json.dumps(run)}\n", encoding="utf-8")
            assert main(["ingest", str(path)]) == 0
    assert main(["dashboard", "--out", "site"]) == 0
    page = (Path("site") / "compare.html").read_text(encoding="utf-8")
    links = sorted(set(re.findall(r'href="(compare/[^"]+)"', page)))
    assert len(links) == 2, links
    for link, cell in zip(links, ("torch-2.11", "torch-2.13"), strict=True):
        assert f"nightly-11-{cell}" in (Path("site") / link).read_text(encoding="utf-8"), link


# -- 3. a run whose every test was skipped -----------------------------------------------------------


def test_a_run_whose_every_test_was_skipped_is_not_green(store, tmp_path, capsys) -> None:
    """The grid's pytest column was green for a run whose tests were all skipped (nothing passed); a skip
    is neutral, grey, as in the suites' columns beside it."""
    path = _export(tmp_path / "skipped.jsonl", None, _outcome("skipped"), _outcome("skipped", "t::b"))
    assert main(["ingest", str(path)]) == 0
    assert main(["dashboard", "--out", "site"]) == 0
    row = (Path("site") / "index.html").read_text(encoding="utf-8").split("<tr id=")[1]
    assert '<td class="none">2 skipped</td>' in row, row


# -- 4. a configuration file's format that is no version ------------------------------------------------


@pytest.mark.parametrize("value", ["true", "0", "-1", "1.0", '"1"'])
@pytest.mark.parametrize("option", ["--expected", "--thresholds"])
def test_a_config_format_that_is_no_version_is_refused(store, tmp_path, capsys, option, value) -> None:
    """``format = true`` (TOML's boolean is Python's 1) and ``format = 0`` were read as version 1, and
    ``format = 1.0`` was called newer than this reader."""
    config = tmp_path / "config.toml"
    config.write_text(f"format = {value}\n", encoding="utf-8")
    before = store.read_bytes()
    capsys.readouterr()
    assert main(["regressions", option, str(config)]) == 2
    line = one_error_line(capsys)
    assert f"{config}: format {value} is not a format version; expected 1" in line
    assert store.read_bytes() == before


@pytest.mark.parametrize("value", ["true", "1.0"])
def test_a_paper_format_that_is_no_version_is_refused(store, tmp_path, capsys, value) -> None:
    """The paper's figures took ``format = true`` and ``format = 1.0`` for version 1 (both equal 1)."""
    shipped = (Path(__file__).resolve().parents[1] / "matrix" / "paper.toml").read_text(encoding="utf-8")
    paper = tmp_path / "paper.toml"
    paper.write_text(re.sub(r"(?m)^format = 1$", f"format = {value}", shipped), encoding="utf-8")
    capsys.readouterr()
    assert main(["dashboard", "--out", "site", "--paper", str(paper)]) == 2
    assert f"{paper}: 'format' must be 1, not {value}" in one_error_line(capsys)
    assert not Path("site").exists()


# -- 5. a finished run's row brought again with other values -------------------------------------------


def test_a_finished_runs_row_brought_again_with_other_values_is_refused(store, tmp_path, capsys) -> None:
    """The stored row was kept and the other counted 'already present': a file saying the test failed
    left the stored run saying it passed, silently."""
    assert main(["ingest", str(_export(tmp_path / "a.jsonl", None, _outcome("passed")))]) == 0
    changed = _export(tmp_path / "b.jsonl", None, _outcome("failed"))
    capsys.readouterr()
    assert main(["ingest", str(changed)]) == 2
    line = one_error_line(capsys)
    assert f"{changed}:3: test_outcomes row 'suites/test_a.py::test_a' of run {UID}" in line
    assert "differs from the stored one in 'outcome'" in line
    assert main(["summary", "--json"]) == 0  # the stored run as it was
    assert json.loads(capsys.readouterr().out)[0]["outcomes"] == {"passed": 1}


def test_a_finished_run_ingested_again_as_it_is_changes_nothing(store, tmp_path, capsys) -> None:
    """Text the store cleans on the way in (a NUL) and a time with an offset compare as the store wrote
    them, so the same export ingests again as 'already present'."""
    path = _export(
        tmp_path / "a.jsonl",
        {"started_at": "2026-01-02T03:04:05+02:00"},
        {**_outcome("failed"), "message": "bad\x00 value"},
    )
    assert main(["ingest", str(path)]) == 0
    capsys.readouterr()
    assert main(["ingest", "--json", str(path)]) == 0
    stats = json.loads(capsys.readouterr().out)[str(path)]
    assert stats["rows_present"] == {"test_outcomes": 1} and not stats["rows_added"]


# -- 6. a store another process keeps locked ---------------------------------------------------------


def test_a_store_locked_past_the_busy_wait_is_one_line_at_once(store, tmp_path, capsys, monkeypatch) -> None:
    """SQLite's busy wait (60 s) ran out, and ingest ran the whole transaction again four more times: five
    minutes of silence before its error. Now the first wait that runs out is the answer, in one line."""
    import sqlite3
    import time

    from matrix.store import db

    monkeypatch.setattr(db, "BUSY_TIMEOUT_S", 0.5)
    path = _export(tmp_path / "a.jsonl", None, _outcome("passed"))
    holder = sqlite3.connect(store, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer, in the middle of its transaction
    try:
        capsys.readouterr()
        started = time.monotonic()
        assert main(["ingest", str(path)]) == 2
        assert time.monotonic() - started < 5 * 0.5  # one wait, not one per attempt
        line = one_error_line(capsys)
        assert "is locked: another process" in line and "nothing was written" in line
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert main(["summary", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []  # nothing of the file was stored
