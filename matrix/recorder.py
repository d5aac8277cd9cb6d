"""pytest plugin ``-p matrix.recorder``: every suite outcome and record into the results store.

Problem: the suites run under pytest, usually spread over pytest-xdist workers, and a cell's process
may be killed (out of memory, a driver fault, a timeout). Every test outcome and every result record
(suites/records.py) must reach the store exactly once, and whatever was recorded before a crash must
survive it.

Design: only the controlling process writes. Under xdist, workers carry a ``workerinput`` attribute on
their config and do not record; their reports, with the records inside ``user_properties``, reach the
controller through ``pytest_runtest_logreport``, as do the synthetic reports xdist makes for a worker
that died (``when == "???"``), which are stored as outcome ``crashed``. Each report is written in its
own transaction, so a crash loses at most the report being written. The run row is created
``running`` at session start and finished at session end; a process killed in between leaves it
``running``, and ``grace-matrix run`` or the stale-run check (matrix.store.access) marks it crashed.

Invariants:
- One ``TestOutcome`` per test node id per run; a later phase may only make it worse (teardown error).
  A failing outcome's message starts with its phase (``call: ...``, ``teardown: ...``, ``worker: ...``):
  a test that fails without recording a result is judged from this row alone (the ``tests`` suite,
  Note: [Every outcome reaches a verdict] in matrix.regressions.observations).
- A test that started and settled no outcome before the session ended (an interrupt, a fatal error)
  is recorded ``error`` with a message starting ``interrupted:``, and the run's message names it.
- A record is keyed ``<nodeid>#<n>``, n its position among the test's records; a key is written once.
- A report that cannot be written (after retries) is counted, logged and reported at session end
  (the run's message says how many); it never stops the test session. A record field the schema has no
  column for goes into the row's ``details`` when it has one, else it is named in the run's message.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import time
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from matrix.errors import MatrixError
from matrix.fingerprint import probe_environment, project_git_sha
from matrix.redact import redact, redact_value
from matrix.runner import ENV_CELL, ENV_LABEL
from matrix.store.access import (
    command_line,
    finish_run,
    get_or_create_cell,
    get_or_create_workload,
    reap_stale_runs,
    start_run,
)
from matrix.store.db import default_url, display_url, open_store
from matrix.store.models import (
    CorrectnessResult,
    Diagnostic,
    PerformanceResult,
    PIStageResult,
    Run,
    RunStatus,
    TestOutcome,
)
from suites.records import (
    USER_PROPERTY_KEY,
    CorrectnessRecord,
    DiagnosticRecord,
    PerformanceRecord,
    PIStageRecord,
    Record,
    RecordFormatError,
    WorkloadRef,
    record_from_property,
)

logger = logging.getLogger(__name__)

PLUGIN_NAME = "grace-matrix-recorder"
_MAX_ATTEMPTS = 5
_MESSAGE_LIMIT = 4000

_MODELS: dict[type[Any], type[Any]] = {
    CorrectnessRecord: CorrectnessResult,
    PerformanceRecord: PerformanceResult,
    PIStageRecord: PIStageResult,
    DiagnosticRecord: Diagnostic,
}
_RANK = {"passed": 0, "skipped": 1, "error": 2, "failed": 3, "crashed": 4}
_FAILURES = ("error", "failed", "crashed")
_COMPLETE_EXIT = {
    pytest.ExitCode.OK: None,
    pytest.ExitCode.TESTS_FAILED: None,
    pytest.ExitCode.NO_TESTS_COLLECTED: "no tests collected (pytest exit code 5)",
}


def recorded_command(argv: list[str]) -> str:
    """The run's command as stored: the store URL hidden, machine paths replaced (matrix.redact)."""
    return redact(command_line(argv)) or ""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("grace-matrix", "recording into the grace-matrix results store")
    group.addoption(
        "--grace-matrix-db", metavar="URL", help="store URL (default: GRACE_MATRIX_DB or the SQLite file)"
    )
    group.addoption("--grace-matrix-cell", metavar="ID", help=f"cell id (default: {ENV_CELL} or 'current')")
    group.addoption("--grace-matrix-kind", metavar="KIND", help="cell kind (default: from matrix.toml)")
    group.addoption(
        "--grace-matrix-label", metavar="LABEL", help=f"run label, e.g. a nightly's date ({ENV_LABEL})"
    )
    group.addoption("--grace-matrix-run-uid", metavar="UID", help="uid for the run row (default: a new UUID)")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker: its reports reach the controller, which records them
    if config.getoption("help", False) or config.getoption("collectonly", False):
        return  # nothing runs, so there is no run to record
    try:
        recorder = Recorder.from_config(config)
    except MatrixError as exc:
        raise pytest.UsageError(f"grace-matrix recorder: {exc}") from None
    config.pluginmanager.register(recorder, PLUGIN_NAME)


@dataclasses.dataclass
class _TestState:
    outcome: str | None = None
    duration_s: float = 0.0
    message: str | None = None
    worker: str | None = None
    written_records: set[int] = dataclasses.field(default_factory=set)


class Recorder:
    """Writes one run: created at session start, one transaction per report, finished at session end."""

    def __init__(
        self, Session: sessionmaker[Session], url: str, run_pk: int, run_uid: str, cell_id: str
    ) -> None:
        self.Session = Session
        self.url = url
        self.run_pk = run_pk
        self.run_uid = run_uid
        self.cell_id = cell_id
        self.tests: dict[str, _TestState] = {}
        self.started: set[str] = set()  # tests whose run began and has not finished (pytest's logstart)
        self.workloads: dict[tuple[str, str], int] = {}
        self.outcomes_written = 0
        self.records_written = 0
        self.failures: list[str] = []
        self.unstored: set[str] = set()

    @classmethod
    def from_config(cls, config: pytest.Config) -> Recorder:
        url = config.getoption("grace_matrix_db") or default_url()
        cell_id = config.getoption("grace_matrix_cell") or os.environ.get(ENV_CELL) or "current"
        kind = config.getoption("grace_matrix_kind") or _kind_from_matrix(config, cell_id)
        label = config.getoption("grace_matrix_label") or os.environ.get(ENV_LABEL)
        Session = open_store(url)
        env = probe_environment(cell_id, kind)
        command = recorded_command(["pytest", *config.invocation_params.args])
        with Session.begin() as session:
            reap_stale_runs(session)
            cell = get_or_create_cell(session, env)
            run = start_run(
                session,
                cell,
                uid=config.getoption("grace_matrix_run_uid"),
                label=label,
                git_sha=project_git_sha(config.rootpath),
                command=command,
            )
            run_pk, run_uid = run.id, run.uid
        logger.info("recording run %s of cell %s into %s", run_uid, cell_id, display_url(url))
        return cls(Session, url, run_pk, run_uid, cell_id)

    # -- pytest hooks -------------------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.started.add(nodeid)

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        self.started.discard(nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._write_report(report.nodeid, report, _phase_outcome(report))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._write_report(report.nodeid or "<collection>", report, "error")

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode) -> None:
        code = int(exitstatus)
        try:
            exit_code = pytest.ExitCode(code)
        except ValueError:
            exit_code = None
        if exit_code in _COMPLETE_EXIT:
            status, message = RunStatus.COMPLETE, _COMPLETE_EXIT[exit_code]
        else:
            status, message = RunStatus.FAILED, f"pytest exited with {exit_code.name if exit_code else code}"
            unfinished = self._record_unfinished(message)
            if unfinished:
                message += f"; {len(unfinished)} test(s) did not finish, first: {unfinished[0]}"
        problems = []
        if self.failures:
            problems.append(
                f"{len(self.failures)} report(s) could not be recorded, first: {self.failures[0]}"
            )
        if self.unstored:
            problems.append(
                f"record fields with no store column were not kept: {', '.join(sorted(self.unstored))}"
            )
        if problems:
            message = "; ".join([message, *problems] if message else problems)
        with self.Session.begin() as db:
            run = db.get_one(Run, self.run_pk)
            finish_run(db, run, status, exit_code=code, message=message)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        line = (
            f"grace-matrix: run {self.run_uid} of cell {self.cell_id}: {self.outcomes_written} outcome rows, "
            f"{self.records_written} records into {display_url(self.url)}"
        )
        terminalreporter.write_sep("-", "grace-matrix")
        terminalreporter.write_line(line)
        for failure in self.failures[:5]:
            terminalreporter.write_line(f"grace-matrix: NOT RECORDED: {failure}", red=True)
        if self.unstored:
            fields = ", ".join(sorted(self.unstored))
            terminalreporter.write_line(
                f"grace-matrix: record fields with no store column: {fields}", yellow=True
            )

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        bind = self.Session.kw.get("bind")
        if bind is not None:
            bind.dispose()

    # -- writing ------------------------------------------------------------------------------------

    def _write_report(
        self, nodeid: str, report: pytest.TestReport | pytest.CollectReport, outcome: str | None
    ) -> None:
        state = self.tests.setdefault(nodeid, _TestState())
        state.duration_s += float(getattr(report, "duration", 0.0) or 0.0)
        state.worker = state.worker or _worker_of(report)
        records, problems = _records_of(report, state.written_records)
        if problems:
            outcome = "error" if _RANK.get(outcome or "passed", 0) < _RANK["error"] else outcome
            state.message = "; ".join(problems)
        changed = outcome is not None and (state.outcome is None or _RANK[outcome] > _RANK[state.outcome])
        if changed:
            state.outcome = outcome
            state.message = _message_of(report, outcome) if not problems else state.message
            if outcome in _FAILURES:  # which phase failed, for every reader (Note: [Every outcome ...])
                state.message = f"{_phase_of(report)}: {state.message or 'no message'}"
        if changed or records:
            self._store(nodeid, state, changed, records)

    def _record_unfinished(self, ending: str) -> list[str]:
        """The tests that started but never settled an outcome before the session ended (an interrupt,
        a fatal error), each recorded as ``error`` with a message saying so; their node ids, sorted."""
        unfinished = sorted(n for n in self.started if self.tests.get(n, _TestState()).outcome is None)
        for nodeid in unfinished:
            state = self.tests.setdefault(nodeid, _TestState())
            state.outcome = "error"
            state.message = f"interrupted: the session ended ({ending}) before this test finished"
            self._store(nodeid, state, True, [])
        return unfinished

    def _store(
        self, nodeid: str, state: _TestState, changed: bool, records: list[tuple[int, Record]]
    ) -> None:
        """Write the test's outcome (when ``changed``) and its new records in one transaction, retried
        while the database is busy."""
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                with self.Session.begin() as db:
                    new_outcome = changed and self._upsert_outcome(db, nodeid, state)
                    for index, record in records:
                        self._insert_record(db, nodeid, index, record)
                break
            except (OperationalError, IntegrityError) as exc:  # a busy or raced database: try again
                if attempt == _MAX_ATTEMPTS:
                    self.failures.append(f"{nodeid}: {str(exc.orig).splitlines()[0]}")
                    logger.error("could not record %s: %s", nodeid, exc)
                    return
                time.sleep(0.05 * 2**attempt)
            except (SQLAlchemyError, TypeError, ValueError) as exc:  # a row the store refuses: not transient
                self.failures.append(f"{nodeid}: {str(exc).splitlines()[0]}")
                logger.error("could not record %s: %s", nodeid, exc)
                return
        self.outcomes_written += int(new_outcome)
        state.written_records.update(index for index, _ in records)
        self.records_written += len(records)

    def _upsert_outcome(self, db: Session, nodeid: str, state: _TestState) -> bool:
        """Insert or worsen the test's outcome row; True when the row is new."""
        row = db.scalars(
            select(TestOutcome).where(TestOutcome.run_pk == self.run_pk, TestOutcome.record_key == nodeid)
        ).first()
        if row is None:
            row = TestOutcome(run_pk=self.run_pk, record_key=nodeid, nodeid=nodeid)
            db.add(row)
        new = row.id is None
        row.outcome = state.outcome or "error"
        row.duration_s = state.duration_s
        row.message = state.message
        row.worker = state.worker
        return new

    def _insert_record(self, db: Session, nodeid: str, index: int, record: Record) -> None:
        model = _MODELS[type(record)]
        columns = set(model.__table__.columns.keys())
        values: dict[str, Any] = {}
        extras: dict[str, Any] = {}
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if isinstance(value, WorkloadRef):
                values["workload_pk"] = self._workload_pk(db, value)
                continue
            if isinstance(value, enum.Enum):
                value = value.value
            elif isinstance(value, tuple):
                value = list(value)
            value = redact_value(value)  # no machine paths in stored text (matrix.redact)
            if f.name in columns:
                values[f.name] = value
            elif value != f.default:
                extras[f.name] = value
        if extras and "details" in columns:
            values["details"] = {**extras, **(values.get("details") or {})}
        elif extras:
            # A field the schema has no column for yet: named at session end, never dropped quietly.
            self.unstored.update(f"{record.KIND}.{name}" for name in extras)
        db.add(model(run_pk=self.run_pk, record_key=f"{nodeid}#{index}", nodeid=nodeid, **values))

    def _workload_pk(self, db: Session, ref: WorkloadRef) -> int:
        key = (ref.name, ref.code_hash)
        if key not in self.workloads:
            workload = get_or_create_workload(db, ref.name, ref.code_hash, ref.tier, list(ref.tags))
            self.workloads[key] = workload.id
        return self.workloads[key]


def _kind_from_matrix(config: pytest.Config, cell_id: str) -> str:
    from matrix.cells import load_matrix

    path = config.rootpath / "matrix.toml"
    if path.is_file():
        try:
            return load_matrix(path).cell(cell_id).kind.value
        except MatrixError:
            logger.info("cell %s is not declared in %s; recording it as kind 'current'", cell_id, path)
    return "current"


def _phase_outcome(report: pytest.TestReport) -> str | None:
    """The outcome this report settles, or None when the test has not finished yet."""
    if report.when not in ("setup", "call", "teardown"):
        return "crashed"  # xdist's report for a worker that died while running this test
    if report.when == "call":
        if report.skipped:
            return "skipped"
        return "passed" if report.passed else "failed"
    if report.failed:
        return "error"
    if report.when == "setup" and report.skipped:
        return "skipped"
    return None


def _phase_of(report: pytest.TestReport | pytest.CollectReport) -> str:
    """``collect``, ``setup``, ``call``, ``teardown``, or ``worker`` for xdist's report of a dead worker."""
    if isinstance(report, pytest.CollectReport):
        return "collect"
    return report.when if report.when in ("setup", "call", "teardown") else "worker"


def _message_of(report: pytest.TestReport | pytest.CollectReport, outcome: str | None) -> str | None:
    wasxfail = getattr(report, "wasxfail", None)
    if outcome == "passed":
        return f"xpass: {wasxfail}" if wasxfail is not None else None
    if wasxfail is not None:
        return f"xfail: {wasxfail}"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        return redact(str(longrepr[2]))
    crash = getattr(longrepr, "reprcrash", None)
    text = redact(crash.message if crash is not None else report.longreprtext)
    return text[-_MESSAGE_LIMIT:] if text else None


def _worker_of(report: pytest.TestReport | pytest.CollectReport) -> str | None:
    node = getattr(report, "node", None)
    gateway = getattr(node, "gateway", None)
    return getattr(gateway, "id", None) or getattr(report, "worker_id", None)


def _records_of(
    report: pytest.TestReport | pytest.CollectReport, already: set[int]
) -> tuple[list[tuple[int, Record]], list[str]]:
    """The test's records not written yet, with their positions, and any that could not be read."""
    records: list[tuple[int, Record]] = []
    problems: list[str] = []
    index = 0
    for prop in getattr(report, "user_properties", ()) or ():
        name, value = prop
        if name != USER_PROPERTY_KEY:
            continue
        if index not in already:
            try:
                records.append((index, record_from_property(value)))
            except (RecordFormatError, TypeError, ValueError, KeyError) as exc:
                problems.append(f"record {index} unreadable: {exc}")
                already.add(index)
        index += 1
    return records, problems
