"""Hostile input for the service, a further probe: each test is one finding.

A test outcome no writer records (``FAILED``, ``weird``, empty) that ingest took and every judge then
ignored, so the cell stayed green; a time with an offset stored hours off; usage errors of two lines and
an empty ``--db`` taken for the default store; a finished copy of a run whose changed rows were dropped;
a run uid that broke the comparison links.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_support import export_file, one_error_line, outcome_row

from matrix_cli.main import main

UID = "00000000-0000-0000-0000-0000000000bb"


def _export(path: Path, run: dict[str, object] | None = None, *rows: dict[str, object]) -> Path:
    return export_file(path, UID, run, *rows)


_outcome = outcome_row


def _refused(store: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one error line of ``grace-matrix ARGS``, which must exit 2 and leave the store byte-identical."""
    before = store.read_bytes()
    capsys.readouterr()
    assert main(list(args)) == 2
    line = one_error_line(capsys)
    assert store.read_bytes() == before
    return line


# -- 1. a test outcome no writer records ------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["FAILED", "Failed", "weird", "xfailed", ""])
def test_an_unknown_test_outcome_is_refused_at_ingest(store, tmp_path, capsys, outcome) -> None:
    """Such an outcome used to be stored, and summary, regressions and the dashboard judged the run as if
    the test had passed (the cell green)."""
    path = _export(tmp_path / "bad.jsonl", None, _outcome("passed", "t::ok"), _outcome(outcome))
    line = _refused(store, capsys, "ingest", str(path))
    assert f"{path}:4: field 'outcome' of test_outcomes is str {json.dumps(outcome)}, not one of" in line


def test_every_written_test_outcome_is_ingested(store, tmp_path, capsys) -> None:
    outcomes = ("passed", "failed", "skipped", "error", "crashed")
    path = _export(tmp_path / "ok.jsonl", None, *(_outcome(o, f"t::{o}") for o in outcomes))
    assert main(["ingest", str(path)]) == 0
    capsys.readouterr()
    assert main(["summary", "--json"]) == 0
    (summary,) = json.loads(capsys.readouterr().out)
    assert summary["outcomes"] == dict.fromkeys(outcomes, 1)


# -- 2. a time with an offset ------------------------------------------------------------------------


def test_a_time_with_an_offset_is_stored_as_the_same_moment_in_utc(store, tmp_path, capsys) -> None:
    """SQLite keeps no offset: a start at 02:00+14:00 had been stored as 02:00 UTC, fourteen hours late,
    which reorders runs of machines in other time zones (the latest run of a cell, the baseline)."""
    run = {"started_at": "2026-01-20T02:00:00+14:00", "finished_at": "2026-01-19T22:30:00-05:00"}
    recorded = {"recorded_at": "2026-01-20T02:10:00+14:00"}
    path = _export(tmp_path / "tz.jsonl", run, {**_outcome("passed"), **recorded})
    assert main(["ingest", str(path)]) == 0
    out = tmp_path / "out.jsonl"
    assert main(["export", "-o", str(out)]) == 0
    _, run_line, row = (json.loads(line) for line in out.read_text().splitlines())
    assert run_line["started_at"] == "2026-01-19T12:00:00"
    assert run_line["finished_at"] == "2026-01-20T03:30:00"
    assert row["recorded_at"] == "2026-01-19T12:10:00"


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"])
def test_a_time_that_leaves_the_calendar_in_utc_is_refused(store, tmp_path, capsys, moment) -> None:
    path = _export(tmp_path / "bad.jsonl", {"started_at": moment})
    line = _refused(store, capsys, "ingest", str(path))
    assert f"{path}:2: field 'started_at' of runs is out of range in UTC: str {json.dumps(moment)}" in line


# -- 3. the command line's own refusals --------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["bogus"], "grace-matrix: error: argument COMMAND: invalid choice: 'bogus'"),
        (["cells", "--kind", "x"], "grace-matrix cells: error: unrecognized arguments: --kind x"),
        (["summary", "extra"], "grace-matrix summary: error: unrecognized arguments: extra"),
    ],
)
def test_a_usage_error_is_one_line(store, capsys, argv, expected) -> None:
    """The usage of the whole program used to come first (two lines), and an option the subcommand does
    not know was said without naming the subcommand."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert one_error_line(capsys).startswith(expected)


@pytest.mark.parametrize("url", ["", "  "])
def test_an_empty_store_url_is_refused_not_taken_for_the_default(store, tmp_path, capsys, url) -> None:
    """``--db "$UNSET"`` used to read and write the default store (GRACE_MATRIX_DB, else
    .grace-matrix/store.sqlite): ingest put runs into a store nobody named."""
    path = _export(tmp_path / "ok.jsonl", None, _outcome("passed"))
    before = store.read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["ingest", "--db", url, str(path)])
    assert exited.value.code == 2
    assert "argument --db: an empty store URL" in one_error_line(capsys)
    assert store.read_bytes() == before and not (tmp_path / ".grace-matrix").exists()


@pytest.mark.parametrize("url", ["javascript:alert(1)", "example.org/site", "file:///tmp/site", "https://"])
def test_a_site_url_that_is_not_absolute_http_is_refused(store, tmp_path, capsys, url) -> None:
    """``dashboard --base-url`` goes into every link of the Atom feed: a feed reader would follow a
    ``javascript:`` or relative one."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["dashboard", "--out", str(tmp_path / "site"), "--base-url", url])
    assert exited.value.code == 2
    assert "argument --base-url: not an absolute http(s) URL" in one_error_line(capsys)
    assert not (tmp_path / "site").exists()


# -- 4. a finished copy of a run stored while it ran ---------------------------------------------------


def test_the_finished_copy_of_a_run_replaces_the_rows_it_changed(store, tmp_path, capsys) -> None:
    """The recorder worsens a test's outcome while the run goes on (passed in call, error in teardown): an
    export taken while it ran, then the finished one, used to keep the first copy's 'passed' while the run
    became complete, so the failed test was green everywhere."""
    running = {"status": "running", "finished_at": None}
    first = _export(tmp_path / "early.jsonl", running, _outcome("passed"), _outcome("passed", "t::b"))
    done = {"status": "complete", "finished_at": "2026-11-29T11:00:00+00:00"}
    failed = {**_outcome("error"), "message": "teardown: boom"}
    last = _export(tmp_path / "late.jsonl", done, failed, _outcome("passed", "t::b"))
    assert main(["ingest", str(first)]) == 0
    capsys.readouterr()
    assert main(["ingest", "--json", str(last)]) == 0
    stats = json.loads(capsys.readouterr().out)[str(last)]
    assert stats["runs_updated"] == 1 and stats["rows_updated"] == {"test_outcomes": 1}
    assert stats["rows_present"] == {"test_outcomes": 1}
    assert main(["summary", "--json"]) == 0
    (summary,) = json.loads(capsys.readouterr().out)
    assert summary["outcomes"] == {"error": 1, "passed": 1} and summary["verdict"].startswith("FAIL")
    assert main(["ingest", str(first)]) == 0  # the early copy again: the finished run keeps its rows
    assert main(["summary", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["outcomes"] == {"error": 1, "passed": 1}


# -- 5. a run uid in a link ------------------------------------------------------------------------


def test_a_run_uid_reaches_the_comparison_link_encoded(store, tmp_path, capsys) -> None:
    """A uid holding '+', '&' or '#' went into compare.html's query string as it is: the page read
    another run (or none) than the one the link was for."""
    uid = "run+1&a=x#y"
    path = _export(tmp_path / "odd.jsonl", {"uid": uid}, _outcome("failed"))
    path.write_text(path.read_text().replace(UID, uid), encoding="utf-8")
    assert main(["ingest", str(path)]) == 0
    assert main(["dashboard", "--out", "site"]) == 0
    pages = "".join(p.read_text(encoding="utf-8") for p in Path("site").glob("*.html"))
    links = pages.split('href="compare.html?')[1:]
    assert links and all(link.split('"')[0].endswith("b=run%2B1%26a%3Dx%23y") for link in links), links


def test_a_regressions_anchor_is_a_fragment_whatever_the_run_uid(store, tmp_path, capsys) -> None:
    """A regression's anchor carried the run uid's characters as they were: a space or '#' in it broke
    the index's links to the regression (escaped, so no injection, but a link to nowhere)."""
    for uid, hour, outcome in (("base run#1", 10, "passed"), ("new run#2", 11, "failed")):
        path = _export(
            tmp_path / f"{hour}.jsonl", {"uid": uid, "started_at": f"2026-11-29T{hour}:00:00+00:00"}
        )
        rows = json.dumps({"run": uid, **_outcome(outcome)}) + "\n"
        path.write_text(path.read_text().replace(UID, uid) + rows, encoding="utf-8")
        assert main(["ingest", str(path)]) == 0
    main(["dashboard", "--out", "site"])
    page = (Path("site") / "regressions.html").read_text(encoding="utf-8")
    anchors = re.findall(r'<tr id="([^"]*)"', page)
    links = re.findall(r'href="regressions\.html#([^"]*)"', (Path("site") / "index.html").read_text())
    assert anchors and links, "no regression: this test would check nothing"
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+", a) for a in anchors + links), anchors + links
    assert set(links) <= set(anchors)


@pytest.mark.parametrize("content", [b"hello\n", b""])
def test_a_merge_source_that_is_no_store_is_said_as_a_source(store, tmp_path, capsys, content) -> None:
    """The error for a bad merge source used to advise ``--db``, which names the store merged into."""
    source = tmp_path / "source.sqlite"
    source.write_bytes(content)
    line = _refused(store, capsys, "merge", str(source))
    assert "merge from" in line and "--db" not in line, line
