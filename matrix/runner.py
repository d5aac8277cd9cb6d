"""Run one cell's suites in the current environment, and account for how the run ended.

Problem: a cell's suites can end in four ways: they ran (tests may have failed: those are results),
pytest could not run them (usage or collection error), the process died (killed, out of memory, a
driver fault), or the environment could not even be built. The recording plugin inside pytest can only
witness the first two; a dead process cannot mark its own run.

Design: ``run_cell`` starts pytest as a child process, in a process group of its own, with the recorder
and a run uid chosen here, waits at most the cell's deadline (matrix.toml ``deadline_minutes``), and then
settles the run row from the child's exit status: a signal means ``crashed``, pytest's usage,
internal-error and interrupt codes mean ``failed``, and a run the child never created is created here
with that status. At the deadline the whole group is stopped (SIGTERM, then SIGKILL): a pytest-xdist
controller whose worker died under ``--dist=loadgroup`` waits forever, and only a watchdog outside it
can end the cell; the run is then ``crashed``, with what it recorded until then.
``record_install_failure`` files a run for a cell whose environment could not be built. The pytest
workers (``-n``) come from pytest-xdist when it is installed.

Invariants:
- After ``run_cell`` returns, the run with its uid exists and is not ``running``; a run stopped at its
  deadline is ``crashed``, and no process of its group is left.
- The store URL never appears in the recorded command line (it may carry a password).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from matrix.cells import CellKind, CellSpec
from matrix.errors import ConfigError
from matrix.fingerprint import Environment, probe_environment, project_git_sha
from matrix.store.access import command_line, find_run, finish_run, get_or_create_cell, new_run_uid, start_run
from matrix.store.models import RunStatus

logger = logging.getLogger(__name__)

ENV_TIER = "GRACE_SUITE_TIER"
ENV_CELL = "GRACE_MATRIX_CELL"
ENV_LABEL = "GRACE_MATRIX_LABEL"
PYTEST_COMPLETE = (0, 1, 5)  # ok, tests failed, no tests collected: the suites ran
_GRACE_S = 10.0  # between SIGTERM and SIGKILL of a stopped cell's process group


@dataclasses.dataclass(frozen=True)
class RunResult:
    uid: str
    cell_id: str
    status: RunStatus
    exit_code: int
    message: str | None


def check_workers(workers: str | None) -> None:
    """A ``ConfigError`` for a worker count pytest-xdist would refuse only after the run was recorded:
    ``auto``, ``logical`` or a whole number of at least 0 (0: one process)."""
    if workers is None or workers in ("auto", "logical"):
        return
    if not (workers.isdigit() and workers.isascii()):
        raise ConfigError(f"-n/--workers {workers!r}: give a number of at least 0, 'auto' or 'logical'")


def pytest_command(
    cell: CellSpec,
    url: str,
    uid: str,
    label: str | None,
    workers: str | None,
    pytest_args: Sequence[str],
) -> list[str]:
    """The child's argv: the cell's paths and markers, the recorder, xdist workers, then the user's args."""
    argv = [sys.executable, "-m", "pytest", *cell.paths, "-p", "matrix.recorder"]
    argv += [
        f"--grace-matrix-db={url}",
        f"--grace-matrix-cell={cell.id}",
        f"--grace-matrix-kind={cell.kind.value}",
    ]
    argv += [f"--grace-matrix-run-uid={uid}"]
    if label:
        argv.append(f"--grace-matrix-label={label}")
    if workers and workers != "0":
        if importlib.util.find_spec("xdist") is None:
            logger.warning("pytest-xdist is not installed; running the suites in one process")
        else:
            argv += ["-n", workers, "--dist=loadgroup"]  # tests sharing an xdist_group share a worker
    if cell.markers:
        argv += ["-m", cell.markers]
    argv.append("--tb=short")  # a failure in a few lines, not the test's source and docstring again
    return argv + list(pytest_args)


def run_cell(
    Session: sessionmaker[Session],
    url: str,
    cell: CellSpec,
    project_root: Path,
    label: str | None = None,
    workers: str | None = "auto",
    pytest_args: Sequence[str] = (),
) -> RunResult:
    """Run ``cell``'s suites as a pytest child process and settle its run row (module docstring)."""
    uid = new_run_uid()
    argv = pytest_command(cell, url, uid, label, workers, pytest_args)
    env = dict(os.environ)
    env[ENV_TIER] = cell.tier
    # The project's packages (suites, grace) from the project root; this matrix package wherever it is.
    own_root = str(Path(__file__).resolve().parent.parent)
    paths = [str(project_root), own_root, env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    logger.info("running %s", command_line(argv))
    code, stopped = run_until(argv, project_root, env, cell.deadline_s)
    stop = None
    if stopped:
        minutes = f"{cell.deadline_s / 60:g}" if cell.deadline_s else "?"
        stop = (
            f"pytest was stopped at the cell's deadline of {minutes} min (matrix.toml deadline_minutes): "
            "a test hung or an xdist worker died; the results recorded until then are kept"
        )
        logger.error("cell %s: %s", cell.id, stop)
    return settle_run(Session, cell, uid, code, label, argv, stopped=stop)


def run_until(
    argv: Sequence[str], cwd: Path, env: dict[str, str], deadline_s: float | None
) -> tuple[int, bool]:
    """Run ``argv`` in a process group of its own; at ``deadline_s`` stop the whole group (SIGTERM, then
    SIGKILL after a grace period), so a pytest whose xdist worker died cannot hang the cell. The exit
    status (negative: the signal) and whether the deadline stopped it. Ctrl-C and a SIGTERM of this
    process (a nightly or CI job ending the cell) reach the group too, since it is not this one's."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True)
    with _terminate_raises():
        try:
            return proc.wait(timeout=deadline_s), False
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            return proc.wait(), True
        except (KeyboardInterrupt, _Terminated) as exc:
            number = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM
            _signal_group(proc, number)
            try:
                proc.wait(timeout=_GRACE_S)
            except subprocess.TimeoutExpired:
                _stop_group(proc)
            return -number, False


class _Terminated(Exception):
    """This process received SIGTERM while its cell's pytest ran."""


@contextlib.contextmanager
def _terminate_raises() -> Iterator[None]:
    """SIGTERM raises ``_Terminated`` inside the block (main thread only; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(number: int, frame: object) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _signal_group(proc: subprocess.Popen[bytes], number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, number)  # the group's id is the child's pid (start_new_session)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    _signal_group(proc, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_GRACE_S)
    _signal_group(proc, signal.SIGKILL)  # workers that outlived their controller, too


def settle_run(
    Session: sessionmaker[Session],
    cell: CellSpec,
    uid: str,
    code: int,
    label: str | None,
    argv: Sequence[str],
    stopped: str | None = None,
) -> RunResult:
    """Mark the run from the child's exit status; create it if the child never did. ``stopped``: why the
    child was stopped (its deadline); the run is then ``crashed`` with that message, whatever it says."""
    if stopped is not None:
        status, message = RunStatus.CRASHED, stopped
    elif code < 0:
        status, message = RunStatus.CRASHED, f"pytest was killed by {_signal_name(-code)}"
    elif code in PYTEST_COMPLETE:
        status, message = RunStatus.COMPLETE, None
    else:
        status, message = (
            RunStatus.FAILED,
            f"pytest exited with status {code} (usage, internal error or interrupt)",
        )
    with Session.begin() as session:
        run = find_run(session, uid)
        if run is None:
            message = message or "pytest ended without creating its run (the recorder did not start)"
            status = status if status is not RunStatus.COMPLETE else RunStatus.FAILED
            db_cell = get_or_create_cell(session, _environment(cell))
            run = start_run(
                session, db_cell, uid=uid, label=label, git_sha=project_git_sha(), command=command_line(argv)
            )
            finish_run(session, run, status, exit_code=code, message=message)
        elif run.status == RunStatus.RUNNING.value:
            if status is RunStatus.COMPLETE:
                status, message = RunStatus.FAILED, "pytest exited without finishing its run"
            finish_run(session, run, status, exit_code=code, message=message)
        elif stopped is not None:  # it finished its run as it was being stopped: still stopped
            run.status, run.exit_code = RunStatus.CRASHED.value, code
            run.message = stopped if not run.message else f"{run.message}; {stopped}"
        final = RunResult(uid, cell.id, RunStatus(run.status), code, run.message)
    return final


def record_install_failure(
    Session: sessionmaker[Session], cell: CellSpec, message: str, label: str | None = None
) -> RunResult:
    """File a run with status ``install_failed`` for a cell whose environment could not be built."""
    with Session.begin() as session:
        db_cell = get_or_create_cell(session, _environment(cell))
        run = start_run(
            session, db_cell, label=label, git_sha=project_git_sha(), command=f"install cell {cell.id}"
        )
        finish_run(
            session, run, RunStatus.INSTALL_FAILED, message=message.strip()[-8000:] or "install failed"
        )
        return RunResult(run.uid, cell.id, RunStatus.INSTALL_FAILED, 0, run.message)


def _environment(cell: CellSpec) -> Environment:
    """This interpreter's fingerprint, with the cell's declared pins where nothing is installed."""
    env = probe_environment(cell.id, cell.kind.value)
    if cell.kind is CellKind.CURRENT:
        return env
    declared = {k: v for k, v in cell.to_dict().items() if k in ("torch", "triton", "cuda")}
    return dataclasses.replace(
        env,
        torch_version=env.torch_version or declared["torch"],
        triton_version=env.triton_version or declared["triton"],
        extra={**env.extra, "declared": declared},
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
