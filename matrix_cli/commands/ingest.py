"""``grace-matrix ingest``: add exported runs to the store, in one transaction, idempotently.

Several ingests may write one store at once (nightly runners, a fleet on PostgreSQL): the rows are
upserts (``matrix.transfer``), and a transaction that a concurrent writer made fail (SQLite's lock
timeout, a PostgreSQL deadlock) is run again from the start, which ingest's idempotence makes safe; not
after SQLite already waited its whole busy timeout for another process's write (one line then, at once).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from matrix.errors import ConfigError
from matrix.store import db
from matrix.store.db import open_store
from matrix.transfer import ingest_jsonl
from matrix_cli.commands._output import info, print_json

logger = logging.getLogger(__name__)

_ATTEMPTS = 5


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("ingest", help="add exported runs (JSON lines) to the store")
    parser.add_argument("files", nargs="+", metavar="FILE", help="export files; - for stdin")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    Session = open_store(args.db)
    # stdin is read once (a retry reads it again), as bytes where it has them (exact line numbers).
    stdin: list[bytes] | list[str] = []
    if "-" in args.files:
        stdin = getattr(sys.stdin, "buffer", sys.stdin).readlines()
    for attempt in range(1, _ATTEMPTS + 1):
        started = time.monotonic()
        try:
            totals = _ingest_all(Session, args.files, stdin)
            break
        except OperationalError as exc:  # a concurrent writer: locked, deadlocked or serialisation
            waited_out = db.locked_out(exc) and time.monotonic() - started >= db.BUSY_TIMEOUT_S / 2
            if attempt == _ATTEMPTS or waited_out:
                raise
            logger.info("ingest attempt %d met a concurrent writer (%s); again", attempt, exc.orig)
            time.sleep(0.2 * 2**attempt)
    if args.json:
        print_json(totals)
    else:
        for name, stats in totals.items():
            added = sum(stats["rows_added"].values())
            present = sum(stats["rows_present"].values())
            replaced = sum(stats["rows_updated"].values())
            info(
                f"grace-matrix: {name}: {stats['runs_added']} runs added, {stats['runs_updated']} updated, "
                f"{stats['runs_present']} already present; {added} rows added, {present} already present"
                + (f", {replaced} replaced by the finished copy" if replaced else "")
            )
    return 0


def _ingest_all(
    Session: sessionmaker[Session], names: list[str], stdin: list[bytes] | list[str]
) -> dict[str, Any]:
    totals: dict[str, Any] = {}
    with Session.begin() as session:  # every file or nothing
        for name in names:
            if name == "-":
                stats = ingest_jsonl(session, stdin, "<stdin>")
            else:
                try:
                    handle_ = open(name, "rb")  # noqa: SIM115 - closed below; decoded per line
                except OSError as exc:
                    raise ConfigError(f"{name}: cannot read: {exc.strerror}") from None
                with handle_:
                    stats = ingest_jsonl(session, handle_, name, progress=sys.stderr.isatty())
            totals[name] = stats.to_dict()
    return totals
