"""A store that already holds values no reader can use (written by an older grace-matrix, or by hand).

Ingest refuses such values now (``tests/test_cli_hostile_more.py``), but a store may hold them from
before: a run status nobody knows, a latency of zero, negative, NaN or infinite, samples that are not
numbers or no JSON, NaN inside a JSON object. Every reader command used to exit 3 with a traceback on
them. Each test builds a store with the normal API, corrupts rows of the latest run of one cell with raw
SQL and runs the readers through the command line: they work, show the affected cell failing, warn in
one line that names how many rows are unreadable and the command that lists them, and change nothing.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
from cli_support import one_error_line

from matrix.regressions.synthetic import SyntheticCell, SyntheticSpec, seed_history
from matrix.statuses import ResultStatus
from matrix.store.db import open_store
from matrix.store.models import RunStatus
from matrix.unreadable import Unreadable, read_json, read_number, watch
from matrix_cli.main import main

BAD_CELL, GOOD_CELL = "torch-2.10", "torch-2.9"
WARNING = re.compile(
    r"^grace-matrix: warning: (\d+) row\(s\) of the store hold values no reader can use .*"
    r"`grace-matrix check-store` lists them$"
)
PERF = "UPDATE performance_results SET {set} WHERE run_pk = {run} AND mode = 'grace'"
TEST = (
    "UPDATE test_outcomes SET {set} WHERE id = "
    "(SELECT min(id) FROM test_outcomes WHERE run_pk = {run} AND outcome = 'passed')"
)
CORRUPTIONS = {  # name: (SQL, rows it makes unreadable)
    "run status unknown": ("UPDATE runs SET status = 'weird' WHERE id = {run}", 1),
    "latency zero": (PERF.format(set="median_ms = 0, samples_ms = '[0, 0]'", run="{run}"), 2),
    "latency negative": (PERF.format(set="median_ms = -2.5", run="{run}"), 2),
    "latency NaN text": (PERF.format(set="median_ms = 'NaN'", run="{run}"), 2),
    "latency infinite": (PERF.format(set="median_ms = 9e999", run="{run}"), 2),
    "samples not numbers": (
        PERF.format(set="""samples_ms = '["a", "b"]', median_ms = NULL""", run="{run}"),
        2,
    ),
    "samples not JSON": (PERF.format(set="samples_ms = 'not json'", run="{run}"), 2),
    "NaN inside details": (
        """UPDATE correctness_results SET details = '{{"max_abs": NaN}}'
           WHERE run_pk = {run} AND mode = 'grace'""",
        2,
    ),
    "PI details not JSON": (
        "UPDATE pi_stage_results SET details = '{{' WHERE run_pk = {run} AND stage = 'patch'",
        2,
    ),
    # a test whose own records all passed: its outcome row alone says something is wrong
    "test outcome unknown": (TEST.format(set="outcome = 'weird'", run="{run}"), 1),
    "test duration NaN text": (TEST.format(set="duration_s = 'NaN'", run="{run}"), 1),
}
PERF_CORRUPTIONS = [name for name in CORRUPTIONS if name.startswith(("latency", "samples"))]
# Commands that judge the latest run of every cell: each reads every row of the corrupted run.
JUDGING = {"summary": 0, "summary --check": 1, "regressions": 1, "compatibility -o C.md": 0, "dashboard": 0}
READERS = {**JUDGING, "report": 0, "results-doc -o R.md": 0, "paper-doc -o P.md": 0, "pi-status": None}


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store of two cells, two nights each, written through the store models."""
    path = tmp_path / "store.sqlite"
    monkeypatch.setenv("GRACE_MATRIX_DB", f"sqlite:///{path}")
    monkeypatch.chdir(tmp_path)  # no expected.toml, no matrix.toml: nothing but the store
    Session = open_store(f"sqlite:///{path}")
    cells = (
        SyntheticCell(GOOD_CELL, "2.9.1", "3.5.1", "12.8"),
        SyntheticCell(BAD_CELL, "2.10.0", "3.6.0", "12.8"),
    )
    with Session.begin() as session:
        seed_history(session, SyntheticSpec(cells=cells, nights=2, workloads=("mlp", "conv"), samples=5))
    Session.kw["bind"].dispose()
    return path


def corrupt(store: Path, name: str) -> None:
    """Apply corruption ``name`` to the latest run of ``BAD_CELL`` with raw SQL (closed, so checkpointed)."""
    connection = sqlite3.connect(store)
    try:
        (run,) = connection.execute(
            "SELECT runs.id FROM runs JOIN cells ON runs.cell_pk = cells.id WHERE cells.cell_id = ? "
            "ORDER BY runs.started_at DESC LIMIT 1",
            (BAD_CELL,),
        ).fetchone()
        assert connection.execute(CORRUPTIONS[name][0].format(run=run)).rowcount > 0
        connection.commit()
    finally:
        connection.close()


def run_cli(capsys: pytest.CaptureFixture[str], command: str) -> tuple[int, str, list[str]]:
    """Exit status, stdout and the stderr lines of ``grace-matrix COMMAND`` (never a traceback)."""
    capsys.readouterr()
    code = main(command.split())
    out, err = capsys.readouterr()
    assert "Traceback" not in err and code != 3, f"{command}: {err}"
    return code, out, [line for line in err.splitlines() if line.strip()]


def warnings_in(lines: list[str]) -> list[int]:
    """The row counts of the unreadable-rows warnings among stderr ``lines`` (every such line matches)."""
    found = [line for line in lines if "warning" in line]
    assert all(WARNING.match(line) for line in found), found
    return [int(WARNING.match(line).group(1)) for line in found]  # type: ignore[union-attr]


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_every_reader_works_warns_once_and_changes_nothing(store, capsys, name) -> None:
    corrupt(store, name)
    before = store.read_bytes()
    rows = CORRUPTIONS[name][1]
    for command, expected in READERS.items():
        code, _, err = run_cli(capsys, f"{command} --out site" if command == "dashboard" else command)
        if expected is None:  # pi-status: 1 when a stage failed
            expected = 1 if name == "PI details not JSON" else 0
        assert code == expected, (command, err)
        # Every command that read a bad row warns once: every reader reads the runs; pi-status reads
        # no other row than PI stages, the report and the documents read none of those.
        if name.startswith("PI"):
            reads_it = command in JUDGING or command == "pi-status"
        elif name.startswith("test"):  # only the judges read test outcomes
            reads_it = command in JUDGING
        else:
            reads_it = name.startswith("run") or command != "pi-status"
        assert warnings_in(err) == ([rows] if reads_it else []), (command, err)
    assert store.read_bytes() == before


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_the_cell_with_the_bad_row_fails_everywhere_it_is_judged(store, capsys, name) -> None:
    corrupt(store, name)
    _, out, _ = run_cli(capsys, "summary --json")
    verdicts = {s["cell_id"]: s["verdict"] for s in json.loads(out)}
    assert verdicts[GOOD_CELL] == "ok" and verdicts[BAD_CELL].startswith("FAIL"), verdicts
    code, out, err = run_cli(capsys, "summary --check")
    assert code == 1 and any(line.startswith(f"grace-matrix: BROKEN {BAD_CELL}") for line in err), err
    _, out, _ = run_cli(capsys, "regressions")
    assert "FAIL: unreadable" in out and "unreadable stored value" in out, out
    run_cli(capsys, "dashboard --out site")
    index = Path("site/index.html").read_text(encoding="utf-8")
    row = re.search(rf'<tr id="cell-{re.escape(BAD_CELL)}[^"]*">(.*?)</tr>', index, re.S)
    assert row is not None and 'class="bad"' in row.group(1)
    good = re.search(rf'<tr id="cell-{re.escape(GOOD_CELL)}[^"]*">(.*?)</tr>', index, re.S)
    assert good is not None and 'class="bad"' not in good.group(1)


@pytest.mark.parametrize("name", PERF_CORRUPTIONS)
def test_report_shows_the_unreadable_row_and_no_figure(store, capsys, name) -> None:
    corrupt(store, name)
    _, out, _ = run_cli(capsys, f"report --cell {BAD_CELL} --json")
    rows = {(r["workload"], r["mode"]): r for r in json.loads(out)["rows"]}
    for workload in ("mlp", "conv"):
        bad, fine = rows[(workload, "grace")], rows[(workload, "pt2cg")]
        assert bad["status"] == "unreadable" and bad["median_ms"] is None and bad["speedup_vs_pt2cg"] is None
        assert "unreadable stored value" in bad["reason"] and "_ms holds" in bad["reason"]
        assert fine["status"] == "pass" and fine["median_ms"] > 0
    _, out, _ = run_cli(capsys, f"report --cell {BAD_CELL}")
    assert "mlp / grace: unreadable: unreadable stored value:" in out


def test_pi_status_counts_an_unreadable_stage_as_failed(store, capsys) -> None:
    corrupt(store, "PI details not JSON")
    code, out, _ = run_cli(capsys, f"pi-status --cell {BAD_CELL} --json")
    assert code == 1
    failed = [r for r in json.loads(out)["results"] if r["status"] == "unreadable"]
    assert len(failed) == 2 and all(r["stage"] == "patch" and "details holds" in r["message"] for r in failed)
    code, out, _ = run_cli(capsys, f"pi-status --cell {BAD_CELL} --failed --json")
    assert code == 1 and len(json.loads(out)["results"]) == 2


def test_an_unknown_run_status_reads_unreadable_and_the_run_fails(store, capsys) -> None:
    corrupt(store, "run status unknown")
    _, out, _ = run_cli(capsys, "summary --json")
    statuses = {s["cell_id"]: s["status"] for s in json.loads(out)}
    assert statuses == {GOOD_CELL: "complete", BAD_CELL: "unreadable"}
    _, out, _ = run_cli(capsys, "regressions")
    assert "tests:<run>:pytest  FAIL: unreadable" in out and "status holds 'weird'" in out


@pytest.mark.parametrize(
    "name", ["run status unknown", "latency NaN text", "samples not JSON", "test outcome unknown"]
)
def test_check_store_lists_them_and_export_refuses_them(store, tmp_path, capsys, name) -> None:
    corrupt(store, name)
    before = store.read_bytes()
    code, out, err = run_cli(capsys, "check-store --json")
    listed = json.loads(out)
    assert code == 1 and len(listed) == CORRUPTIONS[name][1] and not warnings_in(err)
    assert all(row["values"] and row["run"] for row in listed)
    code, out, err = run_cli(capsys, "check-store")
    assert code == 1 and len(out.splitlines()) == CORRUPTIONS[name][1]
    target = tmp_path / "out.jsonl"
    capsys.readouterr()
    assert main(["export", "-o", str(target)]) == 2
    line = one_error_line(capsys)
    assert "hold values no reader can use, which ingest refuses" in line and "check-store" in line
    assert not target.exists()
    capsys.readouterr()
    assert main(["export", "-o", "-"]) == 2
    assert capsys.readouterr().out == ""  # refused before the first line
    code, _, _ = run_cli(capsys, f"export --cell {GOOD_CELL} -o {target}")
    assert code == 0 and target.is_file()  # the other cell's runs still move
    assert store.read_bytes() == before


def test_a_clean_store_warns_nothing(store, capsys) -> None:
    for command in ("summary", "report", "regressions", "check-store"):
        code, _, err = run_cli(capsys, command)
        assert code == 0 and not warnings_in(err), (command, err)


def test_the_column_types_read_bad_values_as_markers() -> None:
    with watch() as met:
        assert read_number(1.5, positive=True) == 1.5 and read_number(None) is None
        for value in (0, -1.0, float("nan"), float("inf"), "1.5", True, b"x"):
            assert isinstance(read_number(value, positive=True), Unreadable), value
        assert isinstance(read_number(float("nan")), Unreadable) and read_number(-1.0) == -1.0
        assert read_json([1.0, 2], list, latencies=True) == [1.0, 2]
        for value in ([0.0], [1.0, float("nan")], ["1.5"], [True], {"a": 1}, [[1.0]]):
            assert isinstance(read_json(value, list, latencies=True), Unreadable), value
        assert isinstance(read_json({"a": [float("inf")]}, dict), Unreadable)
        assert isinstance(read_json([1], dict), Unreadable)
        assert RunStatus.read("complete") is RunStatus.COMPLETE
        assert RunStatus.read("weird") is RunStatus.UNREADABLE
    assert met.count == 17
    assert str(ResultStatus.UNREADABLE) == "unreadable"


BOM = b"\xef\xbb\xbf"


def test_an_export_that_starts_with_a_byte_order_mark_is_read(store, tmp_path, capsys) -> None:
    """Some Windows editors and PowerShell's Out-File start UTF-8 with a byte-order mark: it is dropped
    for ingest, merge's exports and report --input (the same reader)."""
    export = tmp_path / "runs.jsonl"
    assert main(["export", "--cell", GOOD_CELL, "-o", str(export)]) == 0
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(BOM + export.read_bytes())
    fresh = f"sqlite:///{tmp_path / 'fresh.sqlite'}"
    code, _, err = run_cli(capsys, f"ingest --db {fresh} {marked}")
    assert code == 0 and "2 runs added" in err[-1], err
    code, out, _ = run_cli(capsys, f"report --input {marked} --json")
    assert code == 0 and {r["cell"] for r in json.loads(out)["rows"]} == {GOOD_CELL}
    # Only at the start: a mark inside a line is no JSON there.
    inside = tmp_path / "inside.jsonl"
    lines = export.read_bytes().split(b"\n")
    inside.write_bytes(b"\n".join([lines[0], BOM + lines[1], *lines[2:]]))
    capsys.readouterr()
    assert main(["ingest", "--db", fresh, str(inside)]) == 2
    assert "inside.jsonl:2: not a JSON line" in one_error_line(capsys)
