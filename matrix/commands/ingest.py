"""``grace-matrix ingest``: add exported runs to the store, in one transaction, idempotently."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from matrix.commands._output import info, print_json
from matrix.errors import ConfigError
from matrix.store.db import open_store
from matrix.transfer import ingest_jsonl


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("ingest", help="add exported runs (JSON lines) to the store")
    parser.add_argument("files", nargs="+", metavar="FILE", help="export files; - for stdin")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    Session = open_store(args.db)
    totals: dict[str, Any] = {}
    with Session.begin() as session:  # every file or nothing
        for name in args.files:
            if name == "-":
                stats = ingest_jsonl(session, sys.stdin, "<stdin>")
            else:
                try:
                    handle_ = open(name, encoding="utf-8")  # noqa: SIM115 - closed below
                except OSError as exc:
                    raise ConfigError(f"{name}: cannot read: {exc.strerror}") from None
                with handle_:
                    stats = ingest_jsonl(session, handle_, name, progress=sys.stderr.isatty())
            totals[name] = stats.to_dict()
    if args.json:
        print_json(totals)
    else:
        for name, stats in totals.items():
            added = sum(stats["rows_added"].values())
            present = sum(stats["rows_present"].values())
            info(
                f"grace-matrix: {name}: {stats['runs_added']} runs added, {stats['runs_updated']} updated, "
                f"{stats['runs_present']} already present; {added} rows added, {present} already present"
            )
    return 0
