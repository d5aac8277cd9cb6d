"""Bad input never costs data: the CLI, the store, ingest and the renderer on hostile input.

Each test is one finding of a probe of the service: a folder the dashboard must not delete, characters a
database refuses, exports with wrong types or encodings, a matrix.toml that reaches pytest as options,
stored text that must stay inert in the feed, the documents and the terminal, stores that read commands
must not create or change, page names that must not collide, files that must follow the umask.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import export_run_line, one_error_line
from sqlalchemy import select
from store_content import fresh_database, pg_base_url

from dashboards.site import slug
from matrix import exportlines, infiles
from matrix.cells import load_matrix, parse_matrix
from matrix.errors import ConfigError
from matrix.fingerprint import Environment
from matrix.regressions.synthetic import seed_demo
from matrix.store.access import get_or_create_cell, start_run
from matrix.store.db import open_store
from matrix.store.models import PIStageResult, Run
from matrix.store.models import TestOutcome as Outcome
from matrix.text import markdown_text, store_text, terminal_text
from matrix_cli.main import main

HOSTILE = "\x1b[31mred\x1b[0m \x07 | <b>`x`</b>\n::error::forged\r##[group]g"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    monkeypatch.setenv("GRACE_MATRIX_DB", url)
    monkeypatch.chdir(tmp_path)  # no expected.toml, no matrix.toml: nothing but the store
    open_store(url).kw["bind"].dispose()
    return url


def _header() -> str:
    return json.dumps({"format": "grace-matrix-export", "version": 1, "schema": "0002"})


def _row(
    table: str, uid: str = "00000000-0000-0000-0000-000000000001", **fields: object
) -> dict[str, object]:
    base: dict[str, object] = {"type": table, "run": uid, "record_key": "t::a#0", "nodeid": "t::a"}
    if table == "test_outcomes":
        base["outcome"] = "failed"
    if table == "performance_results":
        base.update(mode="grace", status="ok", workload={"name": "mlp", "code_hash": "h"})
    return {**base, **fields}


def _export(path: Path, *items: dict[str, object]) -> Path:
    path.write_text("\n".join([_header(), *(json.dumps(i) for i in items)]) + "\n", encoding="utf-8")
    return path


# -- 1. dashboard --out never deletes a folder that is not a site ------------------------------------


def test_dashboard_refuses_a_folder_that_is_not_a_site_and_deletes_nothing(store, tmp_path, capsys) -> None:
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "README.md").write_text("keep me")
    capsys.readouterr()
    assert main(["dashboard", "--out", str(project)]) == 2
    assert "not a site written by grace-matrix" in one_error_line(capsys)
    assert (project / "README.md").read_text() == "keep me" and (project / ".git").is_dir()
    os.chdir(project)
    assert main(["dashboard", "--out", "."]) == 2  # the current folder, as `--out .`
    assert (project / "README.md").exists() and (project / ".git").is_dir()
    os.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    assert main(["dashboard", "--out", str(tmp_path / "afile")]) == 2
    assert (tmp_path / "afile").read_text() == "x"


def test_dashboard_writes_into_an_empty_folder_and_over_its_own_site(store, tmp_path) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    assert main(["dashboard", "--out", str(out)]) == 0
    assert (out / ".grace-matrix-site").is_file() and (out / "index.html").is_file()
    (out / "stale.html").write_text("from an older render")
    assert main(["dashboard", "--out", str(out)]) == 0  # a site of ours is replaced whole
    assert not (out / "stale.html").exists() and (out / "index.html").is_file()


# -- 3. one text-cleaning rule at the store boundary ---------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'any.sqlite'}"
        open_store(url).kw["bind"].dispose()
        yield url
        return
    with fresh_database(pg_base_url()) as url:
        open_store(url).kw["bind"].dispose()
        yield url


def test_nul_and_lone_surrogates_are_stored_the_same_way_on_every_database(any_store, tmp_path) -> None:
    refused = "a\x00b\ud800c"
    items = [
        export_run_line() | {"message": refused},
        _row("test_outcomes", message=refused),
        _row("performance_results", details={refused: [refused]}, reason=refused),
    ]
    path = tmp_path / "nul.jsonl"
    path.write_text(  # json.dumps writes \u0000 and \ud800 escapes, as an export from any store does
        "\n".join([_header(), *(json.dumps(i) for i in items)]) + "\n", encoding="utf-8"
    )
    assert main(["ingest", "--db", any_store, str(path)]) == 0
    Session = open_store(any_store)
    with Session() as s:
        assert s.scalars(select(Outcome.message)).one() == "a\ufffdb\ufffdc" == store_text(refused)
        assert s.scalars(select(Run.message)).one() == store_text(refused)
    Session.kw["bind"].dispose()
    assert main(["ingest", "--db", any_store, str(path)]) == 0  # idempotent: the cleaned row is the same


# -- 4, 5. ingest validates against the export schema; one line and exit 2 -----------------------------


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (
            _row("performance_results", details="not an object"),
            "field 'details' of performance_results must be",
        ),
        (
            _row("performance_results", samples_ms={"a": 1}),
            "field 'samples_ms' of performance_results must be",
        ),
        (_row("performance_results", median_ms="fast"), "field 'median_ms' of performance_results must be a"),
        (_row("performance_results", median_ms=True), "must be a number"),
        (_row("performance_results", peak_mem_bytes=2**63), "out of range for a 64-bit integer"),
        (_row("test_outcomes", duration_s=[1.0]), "must be a number"),
        (_row("test_outcomes", outcome=None), "must not be null"),
        (_row("test_outcomes", worker="w" * 40), "longer than 32 characters"),
        (_row("performance_results", workload={"name": 7}), "field 'name' of workloads must be a string"),
    ],
)
def test_ingest_refuses_fields_of_the_wrong_type_with_file_and_line(
    store, tmp_path, capsys, item, expected
) -> None:
    path = _export(tmp_path / "bad.jsonl", export_run_line(), item)
    capsys.readouterr()
    assert main(["ingest", str(path)]) == 2
    line = one_error_line(capsys)
    assert f"{path}:3" in line and expected in line, line
    assert main(["summary", "--json"]) == 0 and json.loads(capsys.readouterr().out) == []  # nothing landed


def test_a_cell_whose_extra_is_a_list_is_refused(store, tmp_path, capsys) -> None:
    path = _export(tmp_path / "bad.jsonl", export_run_line(extra=["a"]))
    capsys.readouterr()
    assert main(["ingest", str(path)]) == 2
    assert "field 'extra' of cells must be a JSON object" in one_error_line(capsys)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ((_header() + "\n").encode("utf-16"), "bad.jsonl:1: not UTF-8 text"),
        (
            (_header() + "\n" + '{"type": "run", "uid": "\xe9"}\n').encode("latin-1"),
            "bad.jsonl:2: not UTF-8 text",
        ),
        ((_header() + "\n" + "[" * 3000 + "]" * 3000 + "\n").encode(), "bad.jsonl:2: JSON nested too deeply"),
        ((_header() + "\n" + '{"a": ' + "9" * 5000 + "}\n").encode(), "bad.jsonl:2: not a JSON line"),
    ],
)
def test_unreadable_exports_are_one_line_and_exit_2(store, tmp_path, capsys, content, expected) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    capsys.readouterr()
    assert main(["ingest", str(path)]) == 2
    assert expected in one_error_line(capsys)


@pytest.mark.parametrize("command", ["ingest", "report"])
def test_an_export_line_without_end_is_read_only_up_to_the_limit(
    store, tmp_path, capsys, monkeypatch, command
) -> None:
    """A file with no line end (``/dev/zero``, a binary) is refused after ``MAX_LINE`` bytes, not read
    whole; the store is unchanged."""
    monkeypatch.setattr(exportlines, "MAX_LINE", 4096)
    path = tmp_path / "endless.jsonl"
    path.write_bytes(_header().encode() + b"\n" + b"\0" * 5000)
    before = Path(store.removeprefix("sqlite:///")).read_bytes()
    capsys.readouterr()
    args = ["report", "--input", str(path)] if command == "report" else ["ingest", str(path)]
    assert main(args) == 2
    assert "endless.jsonl:2: a line of more than 4096 bytes" in one_error_line(capsys)
    assert Path(store.removeprefix("sqlite:///")).read_bytes() == before


@pytest.mark.parametrize(
    "command",
    [
        ["cells", "--config", "{path}"],
        ["regressions", "--thresholds", "{path}"],
        ["regressions", "--expected", "{path}"],
        ["dashboard", "--out", "{site}", "--paper", "{path}"],
        ["ci-plan", "--config", "{path}"],
    ],
)
def test_a_configuration_file_is_read_only_up_to_the_bound(
    store, tmp_path, capsys, monkeypatch, command
) -> None:
    """A file given for a configuration or data file that holds more than the bound (``/dev/zero`` holds
    endless bytes) is refused once the bound is read: one line, exit 2, no site written."""
    monkeypatch.setattr(infiles, "MAX_TEXT_BYTES", 4096)
    path = tmp_path / "endless.toml"
    path.write_bytes(b"# " + b"x" * 5000)
    args = [part.format(path=path, site=tmp_path / "site") for part in command]
    capsys.readouterr()
    assert main(args) == 2
    assert "more than 4096 bytes" in one_error_line(capsys)
    assert not (tmp_path / "site").exists()


def test_a_reused_run_uid_is_a_configuration_error(store) -> None:
    Session = open_store(store)
    env = Environment("c", "venv", "2.11", "3.6", None, None, None, None, "3.12", "linux", {})
    with Session.begin() as s:
        start_run(s, get_or_create_cell(s, env), uid="u-1")
    with pytest.raises(ConfigError, match="run uid 'u-1' is already in the store"), Session.begin() as s:
        start_run(s, get_or_create_cell(s, env), uid="u-1")


def test_a_matrix_file_that_is_not_utf8_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    for name, data in (
        ("utf16.toml", "format = 1\n".encode("utf-16")),
        ("latin.toml", b"format = 1\n# \xe9\n"),
    ):
        (tmp_path / name).write_bytes(data)
        capsys.readouterr()
        assert main(["cells", "--config", str(tmp_path / name)]) == 2
        assert "not UTF-8 text" in one_error_line(capsys)


# -- 6. matrix.toml validation ----------------------------------------------------------------------


def _matrix(cell: dict[str, object], **top: object) -> dict[str, object]:
    return {
        "format": 1,
        "default_tag": "t",
        "cells": [{"id": "c", "kind": "current", "tags": ["t"], **cell}],
        **top,
    }


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (_matrix({"paths": ["--basetemp=/x"]}), "cells[0].paths: '--basetemp=/x' is not a path"),
        (_matrix({"paths": ["-p"]}), "is not a path (pytest would read it as an option)"),
        (_matrix({"id": "c\n"}), "cells[0].id: 'c\\n' is not a valid id"),
        (_matrix({"tags": ["t\n"]}), "is not a valid name"),
        (_matrix({}, defaults={"tags": "nightly"}), "defaults.tags: expected list, got str"),
        (_matrix({}, kinds={"current": {"tags": "x"}}), "kinds.current.tags: expected list"),
        (_matrix({}, kinds={"current": {"paths": ["-x"]}}), "cells[0].paths: '-x' is not a path"),
    ],
)
def test_matrix_values_that_would_reach_pytest_or_ci_as_commands_are_refused(data, expected) -> None:
    with pytest.raises(ConfigError) as info:
        parse_matrix(data, "m.toml")
    assert expected in str(info.value)


def test_tags_of_a_kind_are_given_to_its_cells(tmp_path) -> None:
    matrix = parse_matrix(_matrix({}, defaults={"tags": ["nightly"]}, kinds={"current": {"tags": ["local"]}}))
    assert matrix.cell("c").tags == ("nightly", "local", "t")
    (tmp_path / "m.toml").write_text(
        'format = 1\ndefault_tag = "t"\n[[cells]]\nid = "c"\nkind = "current"\ntags = ["t"]\n'
    )
    assert load_matrix(tmp_path / "m.toml").cell("c").paths == ("suites",)


# -- 7. stored text stays inert where it goes out ----------------------------------------------------


@pytest.fixture
def hostile_store(store) -> str:
    Session = open_store(store)
    with Session.begin() as s:
        seed_demo(s, message=f"seeded PI failure {HOSTILE}")
    with Session.begin() as s:
        for row in s.scalars(select(PIStageResult)):
            row.message = f"{row.message} {HOSTILE}"
    Session.kw["bind"].dispose()
    return store


def test_the_feed_stays_well_formed_with_control_characters_in_a_reason(hostile_store, tmp_path) -> None:
    out = tmp_path / "site"
    assert main(["dashboard", "--out", str(out)]) == 0
    text = (out / "feed.xml").read_text(encoding="utf-8")
    root = ET.fromstring(text)  # raises on a character XML forbids
    assert root.findall("{http://www.w3.org/2005/Atom}entry")
    assert "\x1b" not in text and "\\x1b[31m" in text


def test_terminal_output_of_report_commands_is_inert(hostile_store, capsys) -> None:
    for command in (["regressions"], ["report"], ["summary", "--all"], ["pi-status"]):
        capsys.readouterr()
        main(command)
        out = capsys.readouterr().out
        assert out.strip(), command
        assert not any(c in out for c in "\x1b\x07\r"), command
        assert not any(line.lstrip().startswith(("::", "##[")) for line in out.splitlines()), command


def test_results_doc_escapes_stored_text_like_the_compatibility_doc(hostile_store, tmp_path) -> None:
    Session = open_store(hostile_store)
    with Session.begin() as s:
        for row in s.scalars(select(Run)):
            row.message = HOSTILE
    Session.kw["bind"].dispose()
    for command, name in (
        ("results-doc", "RESULTS.md"),
        ("compatibility", "COMPATIBILITY.md"),
        ("paper-doc", "PAPER.md"),
    ):
        assert main([command, "-o", str(tmp_path / name)]) == 0
        text = (tmp_path / name).read_text()
        assert "\x1b" not in text and "<b>" not in text and "\n::error" not in text, command
    assert markdown_text("a|b `c` <d>") == "a\\|b 'c' &lt;d&gt;"


@pytest.mark.parametrize("command", ["results-doc", "compatibility", "paper-doc", "export"])
def test_an_output_that_cannot_be_a_file_is_one_line_and_exit_2(store, tmp_path, capsys, command) -> None:
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "keep.txt").write_text("kept")
    blocker = tmp_path / "a-file"
    blocker.write_text("kept")
    for target, message in ((folder, "is a folder"), (blocker / "doc.md", "cannot write")):
        capsys.readouterr()
        assert main([command, "-o", str(target)]) == 2, target
        line = one_error_line(capsys)
        assert str(target) in line and (message in line or "does not exist" in line), line
    assert [p.name for p in folder.iterdir()] == ["keep.txt"] and blocker.read_text() == "kept"


@pytest.mark.parametrize("command", ["results-doc", "compatibility", "paper-doc", "export"])
def test_an_output_never_replaces_a_store(store, tmp_path, capsys, command) -> None:
    """The store the command reads, named as its output by another spelling, and any other SQLite
    database: one line, exit 2, both unchanged and the store still readable."""
    own = Path(store.removeprefix("sqlite:///"))
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("create table t (x)").connection.commit()
    before = {path: path.read_bytes() for path in (own, other)}
    for target in (own.parent / ".." / own.parent.name / own.name, other):
        capsys.readouterr()
        assert main([command, "-o", str(target)]) == 2, target
        assert "is an SQLite database" in one_error_line(capsys)
    assert {path: path.read_bytes() for path in (own, other)} == before
    assert main(["summary"]) == 0


def test_a_site_under_a_file_is_one_line_and_exit_2(store, tmp_path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("kept")
    assert main(["dashboard", "--out", str(blocker / "site")]) == 2
    assert "cannot make the site's folder there" in one_error_line(capsys)
    assert blocker.read_text() == "kept"


def test_terminal_text_neutralises_workflow_commands_and_escapes() -> None:
    shown = terminal_text(HOSTILE)
    assert shown.splitlines()[1].startswith("\\::error::") and "\x1b" not in shown and "\r" not in shown
    assert terminal_text("plain text, ümlaut\ttab") == "plain text, ümlaut\ttab"


# -- 8. read commands never create or change a store --------------------------------------------------


def test_read_commands_never_create_a_store(tmp_path, capsys) -> None:
    typo = tmp_path / "typo" / "x.sqlite"
    reads = ["summary", "regressions", "report", "export", "pi-status", "dashboard", "paper-doc"]
    for command in ([name] for name in reads):
        capsys.readouterr()
        assert main([*command, "--db", f"sqlite:///{typo}"]) == 2, command
        assert "no store at" in one_error_line(capsys)
    assert not typo.parent.exists()


def test_merge_opens_its_sources_read_only(store, tmp_path, capsys) -> None:
    unrelated = tmp_path / "unrelated.sqlite"
    with sqlite3.connect(unrelated) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    before = hashlib.sha256(unrelated.read_bytes()).hexdigest()
    capsys.readouterr()
    assert main(["merge", str(unrelated)]) == 2
    assert "holds no grace-matrix store" in one_error_line(capsys)
    assert hashlib.sha256(unrelated.read_bytes()).hexdigest() == before  # not migrated, no tables added


def test_a_store_failing_its_integrity_check_is_refused_for_writing(tmp_path, capsys) -> None:
    path = tmp_path / "damaged.sqlite"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE t (a TEXT)")
        connection.execute("CREATE INDEX t_a ON t (a)")
        connection.executemany("INSERT INTO t VALUES (?)", [(f"value {i:06d}",) for i in range(5000)])
    open_store(f"sqlite:///{path}").kw["bind"].dispose()  # a grace-matrix store besides the table
    with sqlite3.connect(path) as connection:
        root = connection.execute("SELECT rootpage FROM sqlite_master WHERE name='t_a'").fetchone()[0]
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
    with path.open("r+b") as f:  # scramble the index's root page: the store's own tables stay readable
        f.seek((root - 1) * page_size + 8)
        f.write(b"\xff" * 16)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    export = _export(tmp_path / "ok.jsonl", export_run_line())
    capsys.readouterr()
    assert main(["ingest", "--db", f"sqlite:///{path}", str(export)]) == 2
    assert "fails SQLite's integrity check" in one_error_line(capsys)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


# -- 9, 10. page names, file modes --------------------------------------------------------------------


def test_slugs_are_injective() -> None:
    names = ["mlp large", "mlp_large", "mlp-large", ".hidden", "", "a/b", "a_b", "x" * 100, "x" * 101]
    names += [slug(n) for n in names]  # a name that looks like another's slug
    assert len({slug(n) for n in set(names)}) == len(set(names))
    assert slug("mlp large") != slug("mlp_large-654e7087")
    assert slug("mlp") == "mlp" and slug("DebertaV2ForQuestionAnswering") == "DebertaV2ForQuestionAnswering"


def test_workload_pages_differ_beyond_case() -> None:
    """Names whose slugs differ only in case would be one file on a case-insensitive disk: both get
    hashed page names; every other name keeps its own."""
    from dashboards.workloads import page_slugs

    pages = page_slugs(["mlp", "MLP", "Mlp", "DistilGPT2", "a b", "A B"])
    assert pages["DistilGPT2"] == "DistilGPT2"
    assert len({p.casefold() for p in pages.values()}) == len(pages)
    assert pages["mlp"].startswith("mlp-") and pages["MLP"].startswith("MLP-")


def test_written_files_follow_the_umask(hostile_store, tmp_path) -> None:
    old = os.umask(0o022)
    try:
        assert main(["dashboard", "--out", str(tmp_path / "site")]) == 0
        assert main(["export", "-o", str(tmp_path / "e.jsonl")]) == 0
        assert main(["results-doc", "-o", str(tmp_path / "R.md")]) == 0
    finally:
        os.umask(old)
    assert (tmp_path / "site").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "site" / "index.html").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "e.jsonl").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "R.md").stat().st_mode & 0o777 == 0o644
