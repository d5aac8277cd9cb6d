"""Identity rows and the run lifecycle: cells, workloads, runs and what happens when a run dies.

Problem: several writers (the recording plugin, the ``run`` command, ingest, a fleet of cells on one
PostgreSQL) create the same cell and workload rows, and a run whose process is killed can never mark
itself finished: its row would say ``running`` forever and the dashboards would wait for it.

Design: cells are get-or-created by fingerprint and workloads by (name, code hash), inside the caller's
transaction, by an upsert (``INSERT ... ON CONFLICT DO NOTHING``, then a select): a writer that loses a
creation race to a concurrent one, on SQLite or PostgreSQL, reads the winner's row instead of failing.
A run row starts ``running`` with its host and pid. Two things turn a dead run
into ``crashed``: the parent that launched it (``grace-matrix run`` seeing its child die) and
``reap_stale_runs``, which looks at runs of this host whose process is gone (or whose pid now belongs
to a younger process).

Invariants:
- Functions here take a session and never commit; the caller owns the transaction.
- A run leaves ``running`` exactly once; finished runs are never reopened.
- Runs of other hosts are never declared crashed from here (their processes cannot be seen). A host is
  known by its name: machines that share one store must have distinct host names.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shlex
import socket
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlalchemy import Table, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from matrix.errors import ConfigError
from matrix.fingerprint import Environment
from matrix.store.models import Base, Cell, Run, RunStatus, Workload, utcnow

logger = logging.getLogger(__name__)

_Keyed = TypeVar("_Keyed", bound=Base)
_PID_REUSE_SLACK_S = 5.0
_DB_OPTION = "--grace-matrix-db"


def command_line(argv: Sequence[str]) -> str:
    """The command recorded for a run, with the store URL hidden (it may carry a password)."""
    hidden = []
    for i, arg in enumerate(argv):
        if arg.startswith(_DB_OPTION + "="):
            arg = f"{_DB_OPTION}=<store>"
        elif i > 0 and argv[i - 1] == _DB_OPTION:
            arg = "<store>"
        hidden.append(arg)
    return shlex.join(hidden)


def new_run_uid() -> str:
    return str(uuid.uuid4())


def this_host() -> str:
    return socket.gethostname()


def get_or_create_cell(session: Session, env: Environment) -> Cell:
    values = {
        "fingerprint": env.fingerprint,
        "cell_id": env.cell_id,
        "kind": env.kind,
        "torch_version": env.torch_version,
        "triton_version": env.triton_version,
        "cuda_runtime": env.cuda_runtime,
        "driver_version": env.driver_version,
        "gpu_name": env.gpu_name,
        "gpu_capability": env.gpu_capability,
        "python_version": env.python_version,
        "platform": env.platform,
        "extra": dict(env.extra),
    }
    return get_or_create(session, Cell, values, ("fingerprint",))


def get_or_create_workload(
    session: Session, name: str, code_hash: str, tier: str, tags: list[str]
) -> Workload:
    values = {"name": name, "code_hash": code_hash, "tier": tier, "tags": tags}
    return get_or_create(session, Workload, values, ("name", "code_hash"))


def get_or_create(
    session: Session, model: type[_Keyed], values: dict[str, Any], key: Sequence[str]
) -> _Keyed:
    """The row of ``model`` whose ``key`` columns equal ``values``'; created from ``values`` when there is
    none, also when a concurrent writer creates it at the same time (the insert is an upsert)."""
    stmt = select(model).where(*(getattr(model, k) == values[k] for k in key))
    if (row := session.scalars(stmt).first()) is not None:
        return row
    insert_ignoring_conflict(session, model, values, key)
    return session.scalars(stmt).one()


def insert_ignoring_conflict(
    session: Session, model: type[Base], values: dict[str, Any], key: Sequence[str]
) -> bool:
    """Insert ``values`` unless a row with the same ``key`` (a unique constraint) exists or is being
    created by a concurrent transaction (which this one waits for); True when this call inserted it.
    ``INSERT ... ON CONFLICT DO NOTHING`` on SQLite and PostgreSQL, a savepoint elsewhere."""
    dialect = session.get_bind().dialect.name
    table = cast(Table, model.__table__)
    stmt: sqlite.Insert | postgresql.Insert
    if dialect in ("sqlite", "postgresql"):
        upsert = sqlite.insert if dialect == "sqlite" else postgresql.insert
        stmt = upsert(table).values(**values).on_conflict_do_nothing(index_elements=list(key))
        # RETURNING tells whether a row went in (rowcount is -1 with some drivers).
        return session.execute(stmt.returning(*table.primary_key.columns)).first() is not None
    try:  # pragma: no cover - neither SQLite nor PostgreSQL
        with session.begin_nested():
            session.execute(insert(table).values(**values))
        return True
    except IntegrityError:  # pragma: no cover
        logger.debug("lost a creation race for %s %r", model.__tablename__, values)
        return False


def check_label(label: str | None) -> None:
    """A ``ConfigError`` for a run label longer than its column keeps: PostgreSQL would refuse the run's
    row and an export of it could not be ingested (``--label`` and ``GRACE_MATRIX_LABEL`` come here)."""
    length: int | None = getattr(cast(Table, Run.__table__).c.label.type, "length", None)
    if label is not None and length is not None and len(label) > length:
        raise ConfigError(f"run label of {len(label)} characters; give at most {length}: {label[:40]!r}...")


def start_run(
    session: Session,
    cell: Cell,
    uid: str | None = None,
    label: str | None = None,
    git_sha: str | None = None,
    command: str | None = None,
    status: RunStatus = RunStatus.RUNNING,
    pid: int | None = None,
) -> Run:
    """A new run row; a ``uid`` the store already holds is a ``ConfigError`` (run uids are never reused)."""
    check_label(label)
    uid = uid or new_run_uid()
    if find_run(session, uid) is not None:
        raise ConfigError(
            f"run uid {uid!r} is already in the store; give a new uid (or none for a fresh one)"
        )
    run = Run(
        uid=uid,
        cell=cell,
        status=status.value,
        label=label,
        git_sha=git_sha,
        host=this_host(),
        pid=os.getpid() if pid is None else pid,
        command=command if command is not None else command_line(sys.argv),
    )
    session.add(run)
    session.flush()
    return run


def find_run(session: Session, uid: str) -> Run | None:
    return session.scalars(select(Run).where(Run.uid == uid)).first()


def finish_run(
    session: Session, run: Run, status: RunStatus, exit_code: int | None = None, message: str | None = None
) -> bool:
    """Move ``run`` out of ``running``; False (and nothing changed) when it already left."""
    if run.status != RunStatus.RUNNING.value:
        return False
    run.status = status.value
    run.finished_at = utcnow()
    run.exit_code = exit_code
    if message:
        run.message = message if not run.message else f"{run.message}; {message}"
    return True


def reap_stale_runs(session: Session, host: str | None = None) -> list[Run]:
    """Mark ``crashed`` every running run of ``host`` (this one by default) whose process is gone."""
    host = host or this_host()
    stale = []
    running = select(Run).where(Run.status == RunStatus.RUNNING.value, Run.host == host)
    for run in session.scalars(running):
        if run.pid is not None and process_alive(run.pid, run.started_at):
            continue
        finish_run(session, run, RunStatus.CRASHED, message=f"process {run.pid} on {host} is gone")
        logger.info(
            "run %s (%s) was left running by a dead process; marked crashed", run.uid, run.cell.cell_id
        )
        stale.append(run)
    return stale


def process_alive(pid: int, started_at: dt.datetime | None = None) -> bool:
    """Whether ``pid`` is a live process that could have started a run at ``started_at``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except OSError:  # pragma: no cover - e.g. platforms without signal 0
        return True
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, start = stat
    if state in ("Z", "X"):
        return False
    if started_at is not None and start is not None:
        run_start = started_at if started_at.tzinfo else started_at.replace(tzinfo=dt.timezone.utc)
        if start > run_start.timestamp() + _PID_REUSE_SLACK_S:
            return False  # the pid was reused by a process younger than the run
    return True


def _proc_stat(pid: int) -> tuple[str, float | None] | None:
    """(state, start time in epoch seconds) from /proc on Linux; None elsewhere."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
    except (OSError, StopIteration, ValueError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may contain spaces and parentheses
    state = fields[0]
    try:
        ticks = float(fields[19])  # field 22 of proc(5), counted from the state field (3)
        return state, boot + ticks / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        return state, None
