"""``grace-matrix summary``: one line per run (default: the latest run of each cell)."""

from __future__ import annotations

import argparse
from typing import Any

from matrix.commands._output import info, print_json, print_table
from matrix.store.db import StoreAccess, open_store
from matrix.summary import OUTCOMES, summarize


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("summary", help="runs, their status and outcome counts")
    parser.add_argument("--run", action="append", default=[], help="only this run uid (repeatable)")
    parser.add_argument("--label", action="append", default=[], help="only runs with this label (repeatable)")
    parser.add_argument("--cell", action="append", default=[], help="only runs of this cell id (repeatable)")
    parser.add_argument("--all", action="store_true", help="every matching run, not only the latest per cell")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    Session = open_store(args.db, StoreAccess.EXISTING)
    with Session.begin() as session:
        summaries = summarize(session, args.run, args.label, args.cell, latest_only=not args.all)
    if args.json:
        print_json([s.to_dict() for s in summaries])
        return 0
    if not summaries:
        info("grace-matrix: no runs match (run `nox -s matrix` or `grace-matrix run` first)")
        return 0
    columns = [
        "cell",
        "status",
        "torch",
        "triton",
        "gpu",
        *OUTCOMES,
        "records",
        "seconds",
        "label",
        "message",
    ]
    print_table([s.row() for s in summaries], columns)
    return 0
