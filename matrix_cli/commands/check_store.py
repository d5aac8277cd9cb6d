"""``grace-matrix check-store``: the rows of the store holding values no reader can use, one line each.

Such rows (a latency of zero or NaN, samples that are not numbers, JSON that does not parse, a run status
nobody knows) were written by an older grace-matrix or by hand; readers show them as failures with the
status ``unreadable`` and warn once (``matrix.unreadable``). This command lists them
(``matrix.store.check.find_unreadable``): table, id, record key, run, and each value with what it should
be. Read-only. Exit status 1 when there are some, 0 when every row is readable.
"""

from __future__ import annotations

import argparse
from typing import Any

from matrix.store.check import find_unreadable
from matrix.store.db import StoreAccess, display_url, open_store
from matrix_cli.commands._output import info, print_json, print_text


def register(subparsers: Any) -> None:
    subparsers.add_parser(
        "check-store", help="list the rows of the store holding values no reader can use"
    ).set_defaults(handler=handle, lists_unreadable=True)  # no warning after the list (matrix_cli.main)


def handle(args: argparse.Namespace) -> int:
    Session = open_store(args.db, StoreAccess.EXISTING)
    with Session() as session:
        rows = find_unreadable(session)
    if args.json:
        print_json([row.to_dict() for row in rows])
    elif rows:
        for row in rows:
            print_text(row.line())
        info(
            f"grace-matrix: {len(rows)} row(s) hold values no reader can use; readers show them as failures "
            "(status unreadable); repair or delete them with SQL, or re-ingest their runs from an export"
        )
    else:
        info(f"grace-matrix: every row of {display_url(args.db) if args.db else 'the store'} is readable")
    return 1 if rows else 0
