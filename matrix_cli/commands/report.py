"""``grace-matrix report [--json]``: per cell, workload and mode, status and performance figures; then the
training view of the training workloads (matrix.training_report)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from matrix.errors import MatrixError
from matrix.report import Report, build_report, render_text
from matrix.store.db import StoreAccess, open_store
from matrix.text import terminal_text
from matrix.training_report import build_training, render_training_text
from matrix_cli.commands._output import selection_text


def add_selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", action="append", default=[], help="only this run uid (repeatable)")
    parser.add_argument("--label", action="append", default=[], help="only runs with this label (repeatable)")
    parser.add_argument("--cell", action="append", default=[], help="only this cell id (repeatable)")
    parser.add_argument("--workload", action="append", default=[], help="only workloads matching this glob")
    parser.add_argument(
        "--input",
        action="extend",
        nargs="+",
        default=[],
        metavar="FILE",
        help="read runs from these export files (grace-matrix export, e.g. results/) instead of the store",
    )


def open_selected_store(args: argparse.Namespace) -> sessionmaker[Session]:
    """The store to report on: ``--db`` (or the default store), or an in-memory store holding ``--input``."""
    inputs = getattr(args, "input", None) or []
    if not inputs:
        return open_store(getattr(args, "db", None), StoreAccess.EXISTING)
    from matrix.transfer import store_of_exports

    return store_of_exports(inputs, "--input")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="status, median, floor, speedups and graph facts per cell, workload and mode",
        description="For every cell and workload, the latest run that has it; speedups within that run. "
        "Training workloads also get a training view: time per iteration, kernels in graphs per phase, "
        "memory against pt2cg and the inference twin's grace-vs-pt2cg speedup.",
    )
    add_selection(parser)
    parser.set_defaults(handler=handle)


def selected_report(args: argparse.Namespace) -> Report:
    """The report of the runs and workloads ``add_selection``'s options select."""
    Session = open_selected_store(args)
    with Session() as session:
        return build_report(session, args.run, args.label, args.cell, args.workload)


def handle(args: argparse.Namespace) -> int:
    report = selected_report(args)
    selection = selection_text(args, ("run", "label", "cell", "workload"))
    if not report.rows and selection:
        raise MatrixError(f"no result in the store matches {selection}")
    training = build_training(report)
    if getattr(args, "json", False):
        document = {**report.to_dict(), "training": training.to_dict()}
        json.dump(document, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(terminal_text(render_text(report) + render_training_text(training)))
    return 0
