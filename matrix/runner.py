"""Run one cell's suites in the current environment, and account for how the run ended.

Problem: a cell's suites can end in four ways: they ran (tests may have failed: those are results),
pytest could not run them (usage or collection error), the process died (killed, out of memory, a
driver fault), or the environment could not even be built. The recording plugin inside pytest can only
witness the first two; a dead process cannot mark its own run.

Design: ``run_cell`` starts pytest as a child process with the recorder and a run uid chosen here, waits,
and then settles the run row from the child's exit status: a signal means ``crashed``, pytest's usage,
internal-error and interrupt codes mean ``failed``, and a run the child never created is created here
with that status. ``record_install_failure`` files a run for a cell whose environment could not be
built. The pytest workers (``-n``) come from pytest-xdist when it is installed.

Invariants:
- After ``run_cell`` returns, the run with its uid exists and is not ``running``.
- The store URL never appears in the recorded command line (it may carry a password).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from matrix.cells import CellKind, CellSpec
from matrix.fingerprint import Environment, probe_environment, project_git_sha
from matrix.store.access import command_line, find_run, finish_run, get_or_create_cell, new_run_uid, start_run
from matrix.store.models import RunStatus

logger = logging.getLogger(__name__)

ENV_TIER = "GRACE_SUITE_TIER"
ENV_CELL = "GRACE_MATRIX_CELL"
ENV_LABEL = "GRACE_MATRIX_LABEL"
PYTEST_COMPLETE = (0, 1, 5)  # ok, tests failed, no tests collected: the suites ran


@dataclasses.dataclass(frozen=True)
class RunResult:
    uid: str
    cell_id: str
    status: RunStatus
    exit_code: int
    message: str | None


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
    try:
        code = subprocess.call(argv, cwd=project_root, env=env)
    except KeyboardInterrupt:
        code = -signal.SIGINT
    return settle_run(Session, cell, uid, code, label, argv)


def settle_run(
    Session: sessionmaker[Session],
    cell: CellSpec,
    uid: str,
    code: int,
    label: str | None,
    argv: Sequence[str],
) -> RunResult:
    """Mark the run from the child's exit status; create it if the child never did."""
    if code < 0:
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
