"""``grace-matrix report [--json]``: per cell, workload and mode, status and performance figures."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from matrix.report import build_report, render_text
from matrix.store.db import open_store


def add_selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", action="append", default=[], help="only this run uid (repeatable)")
    parser.add_argument("--label", action="append", default=[], help="only runs with this label (repeatable)")
    parser.add_argument("--cell", action="append", default=[], help="only this cell id (repeatable)")
    parser.add_argument("--workload", action="append", default=[], help="only workloads matching this glob")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="status, median, floor, speedups and graph facts per cell, workload and mode",
        description="For every cell and workload, the latest run that has it; speedups within that run.",
    )
    add_selection(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    Session = open_store(getattr(args, "db", None))
    with Session() as session:
        report = build_report(session, args.run, args.label, args.cell, args.workload)
    if getattr(args, "json", False):
        json.dump(report.to_dict(), sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(report))
    return 0
