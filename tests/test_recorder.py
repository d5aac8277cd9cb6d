"""The recording plugin: exactly-once rows under pytest-xdist, nothing lost when a process dies.

Each test writes a small suite into a temporary directory and runs pytest on it in a child process
with ``-p matrix.recorder``, then reads the store.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import func, select

from matrix.store.access import reap_stale_runs
from matrix.store.db import open_store
from matrix.store.models import CorrectnessResult, PerformanceResult, PIStageResult, Run, Workload
from matrix.store.models import TestOutcome as Outcome

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("xdist")

EMIT = """
from suites.records import (USER_PROPERTY_KEY, CorrectnessRecord, CorrectnessStatus, PerformanceRecord,
                            PerformanceStatus, PIStage, PIStageRecord, StageStatus, WorkloadRef)

def emit(request, record):
    request.node.user_properties.append((USER_PROPERTY_KEY, record.to_property()))
"""


def run_pytest(
    tmp_path: Path, suite: str, *args: str, timeout: float = 240
) -> tuple[subprocess.CompletedProcess[str], str]:
    (tmp_path / "suite").mkdir(exist_ok=True)
    (tmp_path / "suite" / "test_generated.py").write_text(textwrap.dedent(EMIT) + textwrap.dedent(suite))
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "pytest", "suite", "-p", "matrix.recorder", f"--grace-matrix-db={url}"]
    argv += ["-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path), "-c", os.devnull, *args]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, url


def count(session, model, *where) -> int:
    return session.scalar(select(func.count()).select_from(model).where(*where))


@pytest.mark.slow
def test_four_workers_times_500_records_give_exactly_2000_rows(tmp_path) -> None:
    suite = """
    import pytest

    def emit_ten(request):
        for k in range(10):
            wl = WorkloadRef(f"w{k}", code_hash="c")
            if k % 2:
                emit(request, CorrectnessRecord(wl, "eager", CorrectnessStatus.PASS, errors={"max_abs": k}))
            else:
                samples = (1.0, float(k))
                emit(request, PerformanceRecord(wl, "eager", PerformanceStatus.OK, samples_ms=samples))
    """
    # 200 tests x 10 records over 4 workers: about 500 records per worker, 2000 in all.
    # (Pinning exactly 50 tests to each worker would take --dist loadgroup, which pytest-xdist 3.8 cannot
    # apply under pytest 9; the invariant under test is exactly-once, whatever the distribution.)
    tests = "\n@pytest.mark.parametrize('i', range(200))\ndef test_emit(request, i):\n    emit_ten(request)\n"
    proc, url = run_pytest(tmp_path, textwrap.dedent(suite) + tests, "-n", "4")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    Session = open_store(url)
    with Session() as s:
        (run,) = s.scalars(select(Run)).all()
        assert run.status == "complete" and run.exit_code == 0
        records = count(s, CorrectnessResult) + count(s, PerformanceResult)
        assert records == 2000
        assert count(s, Outcome) == 200
        assert count(s, Workload) == 10
        per_worker = dict(s.execute(select(Outcome.worker, func.count()).group_by(Outcome.worker)).all())
        assert set(per_worker) == {"gw0", "gw1", "gw2", "gw3"}  # all four workers reported
        assert sum(per_worker.values()) == 200
        keys = (
            s.scalars(select(CorrectnessResult.record_key)).all()
            + s.scalars(select(PerformanceResult.record_key)).all()
        )
        assert len(set(keys)) == 2000


@pytest.mark.slow
def test_worker_killed_mid_run_loses_nothing_it_recorded(tmp_path) -> None:
    suite = """
    import os, signal
    import pytest

    @pytest.mark.parametrize("i", range(20))
    def test_records(request, i):
        emit(request, PIStageRecord(f"k{i}", PIStage.REWRITE, StageStatus.PASS, message="ok"))

    def test_dies(request):
        emit(request, PIStageRecord("dying", PIStage.REWRITE, StageStatus.PASS))
        os.kill(os.getpid(), signal.SIGKILL)
    """
    proc, url = run_pytest(tmp_path, suite, "-n", "2", "--max-worker-restart", "2")
    assert proc.returncode == 1, proc.stdout[-3000:]
    Session = open_store(url)
    with Session() as s:
        (run,) = s.scalars(select(Run)).all()
        assert run.status == "complete"
        assert count(s, PIStageResult) == 20  # every record of every test that reported
        outcomes = dict(s.execute(select(Outcome.record_key, Outcome.outcome)).all())
        assert len(outcomes) == 21
        dead = [k for k, v in outcomes.items() if v == "crashed"]
        assert dead == ["suite/test_generated.py::test_dies"]
        assert sum(v == "passed" for v in outcomes.values()) == 20
        message = s.scalar(select(Outcome.message).where(Outcome.outcome == "crashed"))
        assert "crashed" in message


def test_killed_process_keeps_its_rows_and_is_marked_crashed(tmp_path) -> None:
    suite = """
    import os, signal
    import pytest

    @pytest.mark.parametrize("i", range(5))
    def test_a_records(request, i):
        emit(request, PIStageRecord(f"k{i}", PIStage.LOAD, StageStatus.PASS))

    def test_b_dies():
        os.kill(os.getpid(), signal.SIGKILL)
    """
    proc, url = run_pytest(tmp_path, suite)
    assert proc.returncode == -9
    Session = open_store(url)
    with Session.begin() as s:
        (run,) = s.scalars(select(Run)).all()
        assert run.status == "running"  # nobody could finish it ...
        assert count(s, PIStageResult) == 5 and count(s, Outcome) == 5  # ... but nothing is lost
        reaped = reap_stale_runs(s)  # the stale-run check sees the pid is gone
        assert [r.uid for r in reaped] == [run.uid]
    with Session() as s:
        run = s.scalars(select(Run)).one()
        assert run.status == "crashed" and "is gone" in run.message


def test_outcomes_of_every_kind(tmp_path) -> None:
    suite = """
    import pytest

    def test_pass(request):
        wl = WorkloadRef("w", tier="smoke", tags=("pi",), code_hash="h")
        emit(request, CorrectnessRecord(wl, "grace", CorrectnessStatus.FAIL_ACCURACY, reason="max_abs 3",
                                        errors={"max_abs": 3.0}))

    def test_fail():
        assert 1 == 2

    def test_skip():
        pytest.skip("needs a GPU")

    @pytest.mark.xfail(reason="known")
    def test_xfail():
        assert False

    @pytest.fixture
    def broken():
        yield
        raise RuntimeError("teardown broke")

    def test_teardown_error(broken):
        pass

    def test_unreadable_record(request):
        request.node.user_properties.append(("grace_matrix.record", {"kind": "nope", "format": 1}))
        request.node.user_properties.append(("other", 1))
    """
    proc, url = run_pytest(tmp_path, suite)
    assert proc.returncode == 1
    assert "grace-matrix: run" in proc.stdout
    Session = open_store(url)
    with Session() as s:
        rows = {o.record_key.split("::")[1]: o for o in s.scalars(select(Outcome))}
        got = {k: v.outcome for k, v in rows.items()}
        assert got == {
            "test_pass": "passed",
            "test_fail": "failed",
            "test_skip": "skipped",
            "test_xfail": "skipped",
            "test_teardown_error": "error",
            "test_unreadable_record": "error",
        }
        assert rows["test_skip"].message.endswith("needs a GPU")
        assert rows["test_xfail"].message == "xfail: known"
        assert "teardown broke" in rows["test_teardown_error"].message
        assert "unknown record kind 'nope'" in rows["test_unreadable_record"].message
        result = s.scalars(select(CorrectnessResult)).one()
        assert (result.status, result.reason, result.errors) == (
            "fail_accuracy",
            "max_abs 3",
            {"max_abs": 3.0},
        )
        assert result.record_key == "suite/test_generated.py::test_pass#0"
        assert (result.workload.name, result.workload.tags, result.workload.code_hash) == ("w", ["pi"], "h")
        run = s.scalars(select(Run)).one()
        assert run.status == "complete" and run.exit_code == 1
        assert "<store>" in run.command and "sqlite" not in run.command
        assert run.cell.cell_id == "current" and run.cell.python_version


def test_no_tests_collected_is_recorded_as_complete(tmp_path) -> None:
    proc, url = run_pytest(tmp_path, "X = 1\n")
    assert proc.returncode == 5
    with open_store(url)() as s:
        run = s.scalars(select(Run)).one()
        assert (run.status, run.exit_code) == ("complete", 5)
        assert "no tests collected" in run.message


def test_a_run_that_collected_no_test_is_never_green(tmp_path, capsys) -> None:
    """Complete, yet it checked nothing: its verdict is a failure of the run, in summary and --check."""
    from matrix_cli.main import main

    proc, url = run_pytest(tmp_path, "X = 1\n")
    assert proc.returncode == 5
    capsys.readouterr()
    assert main(["summary", "--db", url]) == 0
    table = capsys.readouterr().out
    assert "FAIL 1" in table and " ok " not in table
    assert main(["summary", "--db", url, "--check"]) == 1
    assert "collected no test (pytest exit code 5)" in capsys.readouterr().err


def test_collection_error_is_recorded(tmp_path) -> None:
    proc, url = run_pytest(tmp_path, "import not_a_module_anywhere\n")
    assert proc.returncode == 2
    with open_store(url)() as s:
        outcome = s.scalars(select(Outcome)).one()
        assert outcome.outcome == "error" and "not_a_module_anywhere" in outcome.message
        run = s.scalars(select(Run)).one()
        assert run.status == "failed" and run.exit_code == 2


def test_interrupted_session_records_the_test_it_stopped_in(tmp_path) -> None:
    suite = """
    def test_a_passes():
        pass

    def test_b_interrupted():
        raise KeyboardInterrupt

    def test_c_never_started():
        pass
    """
    proc, url = run_pytest(tmp_path, suite)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    with open_store(url)() as s:
        rows = {o.record_key.split("::")[1]: o for o in s.scalars(select(Outcome))}
        assert {k: v.outcome for k, v in rows.items()} == {
            "test_a_passes": "passed",
            "test_b_interrupted": "error",
        }
        assert rows["test_b_interrupted"].message.startswith("interrupted: the session ended (pytest exited")
        run = s.scalars(select(Run)).one()
        assert run.status == "failed" and "INTERRUPTED" in run.message
        assert run.message.endswith(
            "1 test(s) did not finish, first: suite/test_generated.py::test_b_interrupted"
        )


def test_corrupt_store_is_one_usage_error(tmp_path) -> None:
    (tmp_path / "store.sqlite").write_bytes(b"this is not sqlite" * 100)
    proc, _ = run_pytest(tmp_path, "def test_x():\n    pass\n")
    assert proc.returncode == 4
    lines = [line for line in proc.stderr.splitlines() if "grace-matrix recorder" in line]
    assert len(lines) == 1 and "not a readable SQLite database" in lines[0]
    assert "Traceback" not in proc.stderr


def test_record_fields_without_a_column_are_kept_or_named(tmp_path) -> None:
    suite = """
    def test_diag(request):
        wl = WorkloadRef("w")
        emit(request, DiagnosticRecord(wl, "grace", "cpu_scalar", node="mul", **EXTRA))
    """
    import dataclasses as dc

    from matrix.store.models import Diagnostic
    from suites.records import DiagnosticRecord

    fields = {f.name for f in dc.fields(DiagnosticRecord)} - set(Diagnostic.__table__.columns.keys())
    fields -= {"workload"}
    extra = {name: "x" for name in fields if name}
    suite = suite.replace("**EXTRA", f"**{extra!r}")
    suite = suite.replace("from suites.records import (", "from suites.records import (DiagnosticRecord, ")
    proc, url = run_pytest(tmp_path, "from suites.records import DiagnosticRecord\n" + textwrap.dedent(suite))
    assert proc.returncode == 0, proc.stdout[-2000:]
    with open_store(url)() as s:
        row = s.scalars(select(Diagnostic)).one()
        assert (row.code, row.node) == ("cpu_scalar", "mul")
        run = s.scalars(select(Run)).one()
        for name in fields:  # e.g. "effect" until the schema has a column for it
            assert f"diagnostic.{name}" in run.message
        if not fields:
            assert run.message is None
