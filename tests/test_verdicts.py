"""Every outcome reaches a verdict, and a hung cell is stopped (Note: [Every outcome reaches a verdict]).

A small project of ``current`` cells runs through ``grace-matrix run`` (the command each cell session of
``nox -s matrix`` runs), then ``summary --check`` (what ``nox -s matrix`` runs last), ``regressions``,
``dashboard`` and ``nightly``: a cell whose tests fail without recording results is named, fails the
commands and is red on the index and the compatibility page; a cell whose pytest hangs is stopped at its
deadline and recorded as crashed.
"""

from __future__ import annotations

import functools
import os
import re
import textwrap
import time
import types
from pathlib import Path

import pytest
from sqlalchemy import select

from matrix.regressions.errors import RegressionsConfigError
from matrix.regressions.expected import expectations_from_mapping
from matrix.regressions.observations import RUN_SUBJECT, TEST_MODE, Observation, ResultKey, Suite
from matrix.regressions.status import Verdict, bearing_verdicts, judge_run
from matrix.store.db import open_store
from matrix.store.models import PIStageResult, Run
from matrix.store.models import TestOutcome as Outcome
from matrix_cli.main import main

REPO = Path(__file__).resolve().parents[1]

RECORDS = """\
import os
import time

import pytest

from suites.records import USER_PROPERTY_KEY, PIStage, PIStageRecord, StageStatus


def emit(request, subject):
    record = PIStageRecord(subject, PIStage.REWRITE, StageStatus.PASS, message="ok", triton_version="3.7.1")
    request.node.user_properties.append((USER_PROPERTY_KEY, record.to_property()))
"""

BROKEN = """
def test_records_a_pass(request):
    emit(request, "k_ok")


def test_dies_before_its_result():
    raise ModuleNotFoundError("No module named 'torch'")


@pytest.fixture
def broken_fixture():
    raise RuntimeError("setup broke")


def test_setup_error(broken_fixture):
    pass
"""

FINE = """
def test_records_a_pass(request):
    emit(request, "k_fine")
"""

HANG = """
def test_records_a_pass(request):
    emit(request, "k_before_the_hang")


def test_hangs():
    with open(os.path.join(os.path.dirname(__file__), "hang.pid"), "w") as out:
        out.write(str(os.getpid()))
    time.sleep(600)
"""


def _project(root: Path, suites: dict[str, str], deadline_minutes: float | None = None) -> Path:
    lines = ["format = 1", 'default_tag = "nightly"', "", "[defaults]", 'tags = ["nightly"]', ""]
    for cell_id, body in suites.items():
        lines += ["[[cells]]", f'id = "{cell_id}"', 'kind = "current"', f'paths = ["checks/{cell_id}"]']
        if deadline_minutes is not None:
            lines.append(f"deadline_minutes = {deadline_minutes}")
        lines.append("")
        folder = root / "checks" / cell_id
        folder.mkdir(parents=True)
        (folder / f"test_{cell_id}.py").write_text(RECORDS + textwrap.dedent(body), encoding="utf-8")
    config = root / "matrix.toml"
    config.write_text("\n".join(lines), encoding="utf-8")
    return config


@pytest.fixture
def child_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cell processes import grace-matrix from this checkout, installed or not."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def _run(config: Path, db: str, cell_id: str, label: str, *workers: str) -> int:
    argv = ["run", "--config", str(config), "--db", db, "--cell", cell_id, "--label", label]
    return main([*argv, *(workers or ("-n", "0")), "--", "-p", "no:cacheprovider", "-q"])


@pytest.mark.slow
def test_a_cell_whose_tests_fail_without_results_fails_every_reader(
    tmp_path: Path,
    child_pythonpath: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _project(tmp_path, {"broken": BROKEN, "fine": FINE})
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    monkeypatch.chdir(tmp_path)  # no expected.toml here: every failure is unexpected
    assert _run(config, db, "broken", "m1") == 0  # the suites ran: the run is complete, its tests failed
    assert _run(config, db, "fine", "m1") == 0
    capsys.readouterr()

    Session = open_store(db)
    with Session() as session:
        messages = {o.nodeid.rsplit("::", 1)[-1]: o.message for o in session.scalars(select(Outcome))}
    assert messages["test_dies_before_its_result"].startswith("call: ModuleNotFoundError")
    assert messages["test_setup_error"].startswith("setup: RuntimeError: setup broke")

    # What `nox -s matrix` runs last: one line per broken cell, exit 1.
    assert main(["summary", "--db", db, "--label", "m1", "--check"]) == 1
    out, err = capsys.readouterr()
    broken = [line for line in err.splitlines() if "BROKEN" in line]
    assert len(broken) == 1 and "BROKEN broken:" in broken[0], err
    assert "2 FAIL" in broken[0] and "grace-matrix regressions --run m1" in broken[0]
    assert re.search(r"^broken\s+complete\s+FAIL 2\b", out, re.M), out
    assert re.search(r"^fine\s+complete\s+ok\b", out, re.M), out

    # regressions: both failures are new; the message says the phase.
    assert main(["regressions", "--db", db, "--run", "m1"]) == 1
    out = capsys.readouterr().out
    assert "NEW  status      tests:checks/broken/test_broken.py::test_dies_before_its_result:pytest" in out
    assert "message: call: ModuleNotFoundError: No module named 'torch'" in out
    assert "2 new regressions" in out

    # The dashboard: the cell's row is red on the index and on the compatibility page.
    site = tmp_path / "site"
    assert main(["dashboard", "--db", db, "--out", str(site)]) == 0
    index = (site / "index.html").read_text(encoding="utf-8")
    row = r'<tr id="[^"]+">\s*<td><strong>([\w-]+) \([^<]*\)</strong>.*?</tr>'
    rows = {m.group(1): m.group(0) for m in re.finditer(row, index, re.S)}
    assert 'class="bad"' in rows["broken"] and "2 test(s) failed without a result" in rows["broken"]
    assert 'class="bad"' not in rows["fine"]
    header = index.split('<table class="grid">', 1)[0]  # the verdict header names the broken cell first
    assert re.search(r'1 broken cell of 2: <a href="#cell-[^"]+">broken \(no GPU\)</a>', header), header
    compatibility = (site / "compatibility.html").read_text(encoding="utf-8")
    assert re.search(r">broken</a></td>.*?class=\"bad\">FAIL 1/3</td>", compatibility, re.S), compatibility
    pi = (site / "pi.html").read_text(encoding="utf-8")
    assert re.search(r'class="bad">\d+ pass', pi) and "test_dies_before_its_result" in pi  # not green

    # expected.toml covers one failure: the other still breaks the cell; covering both makes it pass.
    entry = '[[expected]]\nsuite = "tests"\nworkload = "*::{}"\nmode = "pytest"\nstatus = "{}"\n'
    entry += 'reason = "known"\n'
    expected = tmp_path / "expected.toml"
    expected.write_text(
        "format = 1\n" + entry.format("test_dies_before_its_result", "failed"), encoding="utf-8"
    )
    assert main(["summary", "--db", db, "--label", "m1", "--check"]) == 1
    assert "1 FAIL" in capsys.readouterr().err
    expected.write_text(expected.read_text() + entry.format("test_setup_error", "error"), encoding="utf-8")
    assert main(["summary", "--db", db, "--label", "m1", "--check"]) == 0


@pytest.mark.slow
def test_nightly_fails_after_every_cell_ran_naming_the_broken_cell(
    tmp_path: Path, child_pythonpath: None, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _project(tmp_path, {"broken": BROKEN, "fine": FINE})
    db = f"sqlite:///{tmp_path / 'target.sqlite'}"
    argv = ["nightly", "--config", str(config), "--db", db, "--workdir", str(tmp_path / "work")]
    argv += ["--label", "n1", "--via", "run", "-j", "1", "-n", "0", "--no-report"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "cell fine: ok" in err and "cell broken: ok" in err  # both ran; the verdict comes after
    lines = [line for line in err.splitlines() if "BROKEN" in line]
    assert len(lines) == 1 and "BROKEN broken:" in lines[0] and "logs/broken.log" in lines[0], err
    assert "broken cells: broken" in err


@pytest.mark.slow
def test_a_hung_cell_is_stopped_at_its_deadline_and_recorded_crashed(
    tmp_path: Path,
    child_pythonpath: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _project(tmp_path, {"hang": HANG}, deadline_minutes=0.5)
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    assert _run(config, db, "hang", "h1", "-n", "2") == 1  # crashed
    assert time.monotonic() - started < 30 + 60, "the deadline did not stop the cell"
    Session = open_store(db)
    with Session() as session:
        run = session.scalars(select(Run)).one()
        subjects = list(session.scalars(select(PIStageResult.subject)))
    assert run.status == "crashed" and "deadline of 0.5 min" in run.message
    assert subjects == ["k_before_the_hang"]  # what it recorded before the deadline is kept
    pid = int((tmp_path / "checks" / "hang" / "hang.pid").read_text())
    for _ in range(100):  # the hung worker went with its process group
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the hung test's process {pid} outlived the deadline")
    capsys.readouterr()
    assert main(["summary", "--db", db, "--check"]) == 1
    err = capsys.readouterr().err
    assert "BROKEN hang:" in err and "crashed" in err and f"tests:{RUN_SUBJECT}:{TEST_MODE} crashed" in err


def _obs(suite: Suite, workload: str, status: str, nodeid: str, mode: str = TEST_MODE) -> Observation:
    return Observation(ResultKey(suite, workload, mode), status, nodeid)


def test_only_unexplained_failures_and_unfinished_runs_are_judged() -> None:
    observations = [
        _obs(Suite.TESTS, "t.py::a", "passed", "t.py::a"),
        _obs(Suite.TESTS, "t.py::b", "skipped", "t.py::b"),
        _obs(Suite.TESTS, "t.py::c", "failed", "t.py::c"),  # its record passed: unexplained
        _obs(Suite.PI, "k_c", "pass", "t.py::c", "rewrite"),
        _obs(Suite.TESTS, "t.py::d", "failed", "t.py::d"),  # its record failed: that record is the verdict
        _obs(Suite.PI, "k_d", "fail", "t.py::d", "rewrite"),
        _obs(Suite.TESTS, "t.py::e", "error", "t.py::e"),
        _obs(Suite.TESTS, "t.py::f", "crashed", "t.py::f"),
        _obs(Suite.TESTS, RUN_SUBJECT, "crashed", ""),
    ]
    kept = {(o.key.suite, o.key.workload) for o in bearing_verdicts(observations)}
    assert kept == {
        (Suite.TESTS, "t.py::c"),
        (Suite.PI, "k_c"),
        (Suite.PI, "k_d"),
        (Suite.TESTS, "t.py::e"),
        (Suite.TESTS, "t.py::f"),
        (Suite.TESTS, RUN_SUBJECT),
    }
    findings = {f.key.workload: f.verdict for f in judge_run("c", observations, [])}
    assert findings["t.py::c"] is Verdict.FAIL and findings[RUN_SUBJECT] is Verdict.FAIL
    # a test that failed in the baseline and passes now is not MISSING
    later = judge_run(
        "c",
        [_obs(Suite.PI, "k_c", "pass", "t.py::c", "rewrite")],
        [],
        [ResultKey(Suite.TESTS, "t.py::c", TEST_MODE)],
    )
    assert [f.verdict for f in later] == [Verdict.PASS]


def test_expected_toml_takes_tests_entries_and_refuses_a_wrong_mode() -> None:
    entry = {"suite": "tests", "workload": "*::test_x", "mode": TEST_MODE, "status": "failed", "reason": "r"}
    (found,) = expectations_from_mapping({"format": 1, "expected": [entry]})
    assert found.suite is Suite.TESTS
    run_entry = {**entry, "workload": RUN_SUBJECT, "status": "crashed"}
    assert expectations_from_mapping({"format": 1, "expected": [run_entry]})
    with pytest.raises(RegressionsConfigError, match="one mode"):
        expectations_from_mapping({"format": 1, "expected": [{**entry, "mode": "call"}]})
    with pytest.raises(RegressionsConfigError, match="not a tests status"):
        expectations_from_mapping({"format": 1, "expected": [{**entry, "status": "pass"}]})


@functools.cache
def _noxfile() -> types.ModuleType:
    """The project's noxfile, loaded as a module once (nox warns when its sessions register again)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("grace_noxfile", REPO / "noxfile.py")
    assert spec is not None and spec.loader is not None
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    return noxfile


def test_nox_matrix_ends_with_a_summary_that_fails_on_a_broken_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    """The matrix session queues every cell, then the dashboard, and last ``summary --check``."""
    noxfile = _noxfile()

    class Session:
        def __init__(self) -> None:
            self.posargs = ["--cell", "triton-3.7", "--label", "m-test"]
            self.notified: list[tuple[str, list[str]]] = []

        def log(self, *args: object) -> None:
            pass

        def error(self, message: str) -> None:
            raise AssertionError(message)

        def notify(self, name: str, posargs: list[str] | None = None) -> None:
            self.notified.append((name, list(posargs or [])))

    monkeypatch.delenv("GRACE_MATRIX_LABEL", raising=False)
    session = Session()
    noxfile.matrix(session)
    names = [name for name, _ in session.notified]
    assert names[0] == "cell(triton-3.7)" and names[-1] == "summary"
    assert session.notified[-1][1] == ["--label", "m-test", "--check"]


def test_an_installers_output_shows_its_progress_and_keeps_the_rest_for_a_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``_stream`` echoes downloads, what was installed and errors; every line stays in the tail that a
    failure's message carries."""
    import sys

    noxfile = _noxfile()
    lines = [
        "Looking in indexes: somewhere",
        "WARNING: Location 'x' is ignored",
        "  Downloading pkg-1.0-py3-none-any.whl (1 kB)",
        "Installing collected packages: pkg",
        "Successfully installed pkg-1.0",
        "ERROR: No matching distribution found for other",
    ]
    script = "import sys\nfor line in sys.argv[1:]: print(line)\nsys.exit(1)"

    class Session:
        def log(self, *args: object) -> None:
            pass

    code, tail = noxfile._stream(Session(), [sys.executable, "-c", script, *lines])
    shown = capsys.readouterr().out.splitlines()
    assert code == 1 and tail.splitlines() == lines
    assert shown == lines[2:]


def test_a_cells_deadline_comes_from_its_kind_or_itself_and_is_checked(tmp_path: Path) -> None:
    from matrix.cells import load_matrix, parse_matrix
    from matrix.errors import ConfigError

    shipped = load_matrix(REPO / "matrix.toml")
    assert all(c.deadline_s for c in shipped.cells), "every shipped cell has a deadline from its kind"
    base = {"format": 1, "default_tag": "t", "kinds": {"current": {"deadline_minutes": 5}}}
    cells = [
        {"id": "a", "kind": "current", "tags": ["t"]},
        {"id": "b", "kind": "current", "deadline_minutes": 0.5},
    ]
    matrix = parse_matrix({**base, "cells": cells})
    assert matrix.cell("a").deadline_s == 300 and matrix.cell("b").deadline_s == 30
    for bad in (0, -1, "10", 10**9):
        with pytest.raises(ConfigError, match="deadline_minutes"):
            parse_matrix({**base, "cells": [{**cells[0], "deadline_minutes": bad}]})
