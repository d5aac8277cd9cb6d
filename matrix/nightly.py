"""The nightly pipeline on one machine: cells as separate processes, one store, regressions, dashboard.

Problem: the nightly CI workflow (matrix.ciplan) runs every cell on its own runner, merges the stores,
judges regressions and renders the dashboard. The same pipeline must run on one machine, to try a change
of the pipeline before it reaches CI and for fleets that share one database instead of CI artifacts.
Cells must stay isolated from each other (a cell that crashes its interpreter must not take the others
with it), so each runs as its own process, and several may run at once.

Design: ``run_nightly`` starts each selected cell as a child process (``nox -s "cell(<id>)"``, or
``grace-matrix run --cell <id>`` in this environment), at most ``jobs`` at a time, each in its own
process group with its log in ``<workdir>/logs/<id>.log``. Every run is labelled with the nightly's label.
Two ways to reach one store (``StoreMode``):

- ``shared``: every cell records straight into the target store, concurrently (a PostgreSQL server;
  the recorder writes one transaction per test report and creates shared rows race-free).
- ``per-cell``: each cell records into its own SQLite file (``<workdir>/stores/<id>.sqlite``), which is
  exported as JSON lines (``<workdir>/exports/<id>.jsonl``, what a CI cell job uploads); the exports are
  then ingested into the target store in one transaction (what the CI report job does).

Then the report steps run on the target store, in this process: the project's expected.toml is loaded
into it, the label's regressions are judged (``<workdir>/regressions.txt``, as ``grace-matrix
regressions --run <label>`` prints them) and the dashboard is rendered into ``<workdir>/site`` by the
``publish`` function the caller gives (the command line passes the dashboards' renderer: dashboards sit
above this package, which never imports them).

Invariants:
- A cell's result is read back from the store it recorded into (runs with the nightly's label and its
  cell id, and their row counts per table), never taken from the child's output.
- A cell that outlives ``timeout_s`` is terminated with its whole process group and reported as timed
  out; an interrupted nightly terminates every child it started.
- The nightly succeeds only when every cell process exited 0 with a finished run in the store, no
  new regression was found and no cell of its label is broken (``matrix.regressions.broken``: an
  unexpected failure, a test that failed without its result, a run that did not complete), which is
  judged after every cell ran and reported one line per broken cell.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from matrix import readmodel
from matrix.cells import CellKind, CellSpec, Matrix
from matrix.recorder import ENV_CELL, ENV_LABEL
from matrix.regressions.broken import BrokenCell, broken_cells
from matrix.regressions.errors import RegressionsError
from matrix.regressions.expected import DEFAULT_FILE, load_expected_file, sync_expected
from matrix.regressions.report import detect
from matrix.regressions.text_report import report_text
from matrix.regressions.thresholds import Thresholds, load_thresholds
from matrix.store.db import ENV_DB, display_url, open_store, sqlite_path
from matrix.store.models import RESULT_TABLES, RunStatus
from matrix.transfer import RunFilter, TransferStats, export_jsonl, ingest_jsonl

logger = logging.getLogger(__name__)

_TERMINATE_GRACE_S = 20.0
# Note: [Alembic is not thread-safe] open_store may run migrations, and Alembic keeps the migration
# context in module globals (alembic.context, alembic.op); two threads migrating at once corrupt each
# other's context. The cell threads of this module open stores only through _open_store.
_OPEN_LOCK = threading.Lock()
ENV_WORKERS = "GRACE_MATRIX_WORKERS"


class StoreMode(str, enum.Enum):
    SHARED = "shared"  # every cell writes into the target store at once
    PER_CELL = "per-cell"  # a SQLite store per cell, exported, then ingested into the target


class Via(str, enum.Enum):
    NOX = "nox"  # nox -s "cell(<id>)": the cell's own environment
    RUN = "run"  # grace-matrix run --cell <id>: this interpreter's environment


@dataclasses.dataclass(frozen=True)
class NightlyOptions:
    cells: tuple[CellSpec, ...]
    label: str
    target_url: str
    mode: StoreMode
    via: Via
    jobs: int
    workdir: Path
    config_path: Path
    workers: str | None = None  # pytest-xdist workers per cell; None: the cell command's default
    timeout_s: float | None = None
    pytest_args: tuple[str, ...] = ()
    report: bool = True

    @property
    def project_root(self) -> Path:
        return self.config_path.resolve().parent


@dataclasses.dataclass(frozen=True)
class RunCount:
    uid: str
    status: str
    rows: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.rows.values())


@dataclasses.dataclass(frozen=True)
class CellOutcome:
    cell_id: str
    exit_code: int
    seconds: float
    timed_out: bool
    log: Path
    store: str  # display URL of the store the cell recorded into
    runs: tuple[RunCount, ...]
    export: Path | None = None

    @property
    def ok(self) -> bool:
        finished = [r for r in self.runs if r.status != RunStatus.RUNNING.value]
        return self.exit_code == 0 and not self.timed_out and bool(finished)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(log=str(self.log), export=None if self.export is None else str(self.export), ok=self.ok)
        return out


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """A report step (regressions, dashboard): its exit status and output, or why it did not run."""

    name: str
    exit_code: int | None
    output: Path | None
    skipped: str | None = None


@dataclasses.dataclass(frozen=True)
class NightlyReport:
    label: str
    mode: StoreMode
    target: str
    cells: tuple[CellOutcome, ...]
    merged: dict[str, Any] | None
    steps: tuple[StepOutcome, ...]
    broken: tuple[BrokenCell, ...] = ()  # cells of the label with unexpected failures (``judge_label``)

    @property
    def new_regressions(self) -> bool:
        return any(s.name == "regressions" and s.exit_code == 1 for s in self.steps)

    @property
    def ok(self) -> bool:
        steps_ok = all(s.skipped is not None or s.exit_code == 0 for s in self.steps)
        return all(c.ok for c in self.cells) and steps_ok and not self.broken

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "mode": self.mode.value,
            "target": self.target,
            "ok": self.ok,
            "new_regressions": self.new_regressions,
            "cells": [c.to_dict() for c in self.cells],
            "merged": self.merged,
            "steps": [
                {**dataclasses.asdict(s), "output": None if s.output is None else str(s.output)}
                for s in self.steps
            ],
            "broken": [{**dataclasses.asdict(b), "line": b.line()} for b in self.broken],
        }


def select_cells(
    matrix: Matrix, ids: Sequence[str], tags: Sequence[str], via: Via
) -> tuple[tuple[CellSpec, ...], tuple[tuple[str, str], ...]]:
    """The cells to run (named ``ids`` or carrying ``tags``; default: tag ``nightly``), and the cells passed
    over with the reason: an exclusion of matrix.toml rules out building their environment here (only
    with ``Via.NOX``; ``Via.RUN`` builds nothing)."""
    selected = matrix.select(tags or ([] if ids else ["nightly"]), ids)
    runnable: list[CellSpec] = []
    passed_over: list[tuple[str, str]] = []
    for cell in selected:
        exclusion = matrix.exclusion_for(cell) if via is Via.NOX else None
        if exclusion is not None:
            passed_over.append((cell.id, exclusion.reason))
        else:
            runnable.append(cell)
    return tuple(runnable), tuple(passed_over)


def default_label(now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now(dt.timezone.utc)
    return f"nightly-{now:%Y-%m-%d-%H%M%S}"


def default_mode(target_url: str) -> StoreMode:
    """SQLite targets take per-cell stores (the CI path); a server takes every cell at once."""
    return StoreMode.PER_CELL if make_url(target_url).get_backend_name() == "sqlite" else StoreMode.SHARED


def cell_command(options: NightlyOptions, cell: CellSpec) -> list[str]:
    """The child process of one cell."""
    if options.via is Via.NOX:
        argv = [sys.executable, "-m", "nox", "-f", str(options.project_root / "noxfile.py")]
        argv += ["-s", f"cell({cell.id})"]
    else:
        argv = [sys.executable, "-m", "matrix_cli", "run", "--cell", cell.id]
        argv += ["--config", str(options.config_path.resolve())]
        if options.workers is not None:
            argv += ["-n", options.workers]
    if options.pytest_args:
        argv += ["--", *options.pytest_args]
    return argv


def cell_store_url(options: NightlyOptions, cell: CellSpec) -> str:
    if options.mode is StoreMode.SHARED:
        return options.target_url
    return f"sqlite:///{(options.workdir / 'stores' / f'{cell.id}.sqlite').resolve()}"


def child_env(options: NightlyOptions, cell: CellSpec, store_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env[ENV_DB] = store_url
    env[ENV_LABEL] = options.label
    env[ENV_CELL] = cell.id
    env["GRACE_MATRIX_CONFIG"] = str(options.config_path.resolve())
    if options.workers is not None:
        env[ENV_WORKERS] = options.workers  # read by the noxfile's cell sessions
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(options.project_root), env.get("PYTHONPATH")]))
    return env


class _Children:
    """The process groups this nightly started, so that an interrupt can end all of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[subprocess.Popen[bytes]] = set()

    @contextlib.contextmanager
    def start(self, argv: Sequence[str], **kwargs: Any) -> Iterator[subprocess.Popen[bytes]]:
        proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
        with self._lock:
            self._live.add(proc)
        try:
            yield proc
        finally:
            with self._lock:
                self._live.discard(proc)

    def terminate_all(self) -> None:
        with self._lock:
            live = list(self._live)
        for proc in live:
            terminate_group(proc)


def terminate_group(proc: subprocess.Popen[bytes]) -> None:
    """End a child and everything it started (its own process group): TERM, then KILL after a grace."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, _TERMINATE_GRACE_S), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _open_store(url: str) -> sessionmaker[Session]:
    """open_store, one thread at a time (see Note: [Alembic is not thread-safe])."""
    with _OPEN_LOCK:
        return open_store(url)


def count_runs(store_url: str, label: str, cell_id: str) -> tuple[RunCount, ...]:
    """The runs a cell recorded under ``label`` in ``store_url``, with their rows per result table."""
    if (path := sqlite_path(store_url)) is not None and not path.exists():
        return ()  # the cell never opened its store (it failed before recording anything)
    Session = _open_store(store_url)
    try:
        with Session() as session:
            selection = readmodel.Selection(labels=(label,), cells=(cell_id,), pick=readmodel.Pick.EVERY)
            runs = readmodel.select_runs(readmodel.load_runs(session), selection)
            counts = []
            for run in runs:
                pk, uid, status = run.pk, run.uid, run.status
                rows = {
                    model.__tablename__: session.scalar(
                        select(func.count()).select_from(model).where(model.run_pk == pk)
                    )
                    or 0
                    for model in RESULT_TABLES
                }
                counts.append(RunCount(uid, status, rows))
            return tuple(counts)
    finally:
        Session.kw["bind"].dispose()


def export_cell(store_url: str, label: str, target: Path) -> Path:
    """Export the nightly's runs of one per-cell store (what a CI cell job uploads)."""
    Session = _open_store(store_url)
    try:
        with Session() as session, target.open("w", encoding="utf-8") as out:
            export_jsonl(session, out, RunFilter(labels=[label]))
    finally:
        Session.kw["bind"].dispose()
    return target


def run_one_cell(options: NightlyOptions, cell: CellSpec, children: _Children) -> CellOutcome:
    store_url = cell_store_url(options, cell)
    if options.mode is StoreMode.PER_CELL and (path := sqlite_path(store_url)) is not None:
        for stale in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            stale.unlink(missing_ok=True)  # the export must hold this nightly's runs only
    log = options.workdir / "logs" / f"{cell.id}.log"
    argv = cell_command(options, cell)
    started = time.monotonic()
    timed_out = False
    with log.open("wb") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        env = child_env(options, cell, store_url)
        with children.start(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=options.project_root, env=env
        ) as proc:
            try:
                code = proc.wait(timeout=options.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                terminate_group(proc)
                code = proc.wait()
    seconds = time.monotonic() - started
    runs = count_runs(store_url, options.label, cell.id)
    export = None
    if options.mode is StoreMode.PER_CELL:
        export = export_cell(store_url, options.label, options.workdir / "exports" / f"{cell.id}.jsonl")
    return CellOutcome(cell.id, code, seconds, timed_out, log, display_url(store_url), runs, export)


def merge_exports(target_url: str, exports: Sequence[Path]) -> TransferStats:
    """Ingest every per-cell export into the target store, all in one transaction."""
    Session = open_store(target_url)
    total = TransferStats()
    try:
        with Session.begin() as session:
            for path in exports:
                with path.open(encoding="utf-8") as lines:
                    stats = ingest_jsonl(session, lines, str(path))
                total.runs_added += stats.runs_added
                total.runs_updated += stats.runs_updated
                total.runs_present += stats.runs_present
                total.rows_added.update(stats.rows_added)
                total.rows_present.update(stats.rows_present)
    finally:
        Session.kw["bind"].dispose()
    return total


Publish = Callable[[Session, Thresholds, Path], str]
"""Renders the dashboard of the store a session reads into a folder, with these thresholds, and returns
a one-line summary of what it wrote."""


def run_report_steps(options: NightlyOptions, publish: Publish | None) -> tuple[StepOutcome, ...]:
    """Load expected.toml into the target store, judge the label's regressions, render the dashboard."""
    thresholds = load_thresholds(None)
    Session = _open_store(options.target_url)
    try:
        expected = options.project_root / DEFAULT_FILE
        if expected.is_file():
            with Session.begin() as session:
                sync_expected(session, load_expected_file(expected))
        steps = [_regressions_step(options, Session, thresholds)]
        steps.append(_dashboard_step(options, Session, thresholds, publish))
    finally:
        Session.kw["bind"].dispose()
    return tuple(steps)


def _regressions_step(
    options: NightlyOptions, Session: sessionmaker[Session], thresholds: Thresholds
) -> StepOutcome:
    output = options.workdir / "regressions.txt"
    with Session() as session:
        try:
            report = detect(session, thresholds, run_spec=options.label)
        except RegressionsError as exc:
            output.write_text(f"{exc}\n", encoding="utf-8")
            return StepOutcome("regressions", exc.exit_code, output)
    output.write_text(report_text(report) + "\n", encoding="utf-8")
    return StepOutcome("regressions", 1 if report.new_regressions else 0, output)


def _dashboard_step(
    options: NightlyOptions, Session: sessionmaker[Session], thresholds: Thresholds, publish: Publish | None
) -> StepOutcome:
    if publish is None:
        return StepOutcome(
            "dashboard", None, None, skipped="no dashboard renderer given (run_nightly's publish)"
        )
    output = options.workdir / "dashboard.txt"
    try:
        with Session() as session:
            line, code = publish(session, thresholds, options.workdir / "site"), 0
    except Exception as exc:  # the step failed: its reason in its output, the night goes on to the verdict
        logger.exception("rendering the dashboard failed")
        line, code = f"rendering the dashboard failed: {type(exc).__name__}: {exc}", 1
    output.write_text(line + "\n", encoding="utf-8")
    return StepOutcome("dashboard", code, output)


def run_nightly(
    options: NightlyOptions,
    progress: Callable[[str], None] = lambda _: None,
    publish: Publish | None = None,
) -> NightlyReport:
    """The whole pipeline (module docstring); ``progress`` receives one line per event; ``publish``
    renders the dashboard (without it that step is reported skipped)."""
    for sub in ("logs", "stores", "exports"):
        (options.workdir / sub).mkdir(parents=True, exist_ok=True)
    # Create or upgrade the target's schema once, before the cells race to open it.
    open_store(options.target_url).kw["bind"].dispose()
    for cell in options.cells:
        if options.via is Via.RUN and cell.kind is not CellKind.CURRENT:
            logger.info("cell %s runs in this interpreter's environment, not its own (--via run)", cell.id)
    children = _Children()

    def one(cell: CellSpec) -> CellOutcome:
        progress(f"cell {cell.id}: started")
        outcome = run_one_cell(options, cell, children)
        state = "timed out" if outcome.timed_out else ("ok" if outcome.ok else f"exit {outcome.exit_code}")
        runs = ", ".join(f"run {r.uid[:8]} {r.status} ({r.total} rows)" for r in outcome.runs) or "no run"
        progress(f"cell {cell.id}: {state} in {outcome.seconds:.0f} s; {runs}; log {outcome.log}")
        return outcome

    try:
        with ThreadPoolExecutor(max_workers=max(1, options.jobs), thread_name_prefix="cell") as pool:
            outcomes = tuple(pool.map(one, options.cells))
    except BaseException:
        children.terminate_all()
        raise

    merged = None
    if options.mode is StoreMode.PER_CELL:
        exports = [o.export for o in outcomes if o.export is not None]
        stats = merge_exports(options.target_url, exports)
        merged = stats.to_dict()
        progress(
            f"merged {len(exports)} exports into {display_url(options.target_url)}: "
            f"{stats.runs_added} runs, {sum(stats.rows_added.values())} rows added"
        )

    steps: tuple[StepOutcome, ...] = ()
    if options.report:
        steps = run_report_steps(options, publish)
        for step in steps:
            progress(
                f"{step.name}: skipped ({step.skipped})"
                if step.skipped
                else f"{step.name}: exit {step.exit_code}; output {step.output}"
            )
    broken = judge_label(options.target_url, options.label, options.project_root)
    for found in broken:
        progress(f"{found.line()}; log {options.workdir / 'logs' / f'{found.cell_id}.log'}")
    return NightlyReport(
        options.label, options.mode, display_url(options.target_url), outcomes, merged, steps, broken
    )


def judge_label(target_url: str, label: str, project_root: Path) -> tuple[BrokenCell, ...]:
    """The cells of ``label`` in the target store with unexpected failures, judged as ``regressions``
    judges them (the project's expected.toml, read and not written; the shipped thresholds)."""
    expected = project_root / DEFAULT_FILE
    expectations = load_expected_file(expected) if expected.is_file() else None
    thresholds = load_thresholds(None)
    Session = _open_store(target_url)
    try:
        with Session() as session:
            try:
                report = detect(session, thresholds, run_spec=label, expectations=expectations)
            except RegressionsError:
                return ()  # no finished run of the label: the cells' own outcomes say why
    finally:
        Session.kw["bind"].dispose()
    return tuple(broken_cells(report, thresholds.status.fail_on))
