"""``grace-matrix summary``: one line per run (default: the latest run of each cell), with its verdict;
``--check`` exits 1 with one line per broken cell (unexpected failures, crashed runs), then closes with the
verdict block (``matrix.summary.verdict_block``: the verdict, since when each broken cell fails, where to
look)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from matrix.errors import MatrixError
from matrix.regressions.expected import DEFAULT_FILE, load_expected_file
from matrix.regressions.status import Expectation
from matrix.regressions.thresholds import load_thresholds
from matrix.store.db import StoreAccess, open_store
from matrix.summary import COLUMNS, judge, summarize, verdict_block
from matrix_cli.commands._output import info, print_json, print_table, selection_text
from matrix_cli.commands.dashboard import DEFAULT_OUT
from matrix_cli.commands.regressions import add_common_options


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("summary", help="runs, their status, verdict and outcome counts")
    parser.add_argument("--run", action="append", default=[], help="only this run uid (repeatable)")
    parser.add_argument("--label", action="append", default=[], help="only runs with this label (repeatable)")
    parser.add_argument("--cell", action="append", default=[], help="only runs of this cell id (repeatable)")
    parser.add_argument("--all", action="store_true", help="every matching run, not only the latest per cell")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a listed run's cell is broken (a FAIL or MISSING against expected.toml, a test "
        "that failed without recording its result, a run that did not complete), one line per cell",
    )
    add_common_options(parser)
    parser.set_defaults(handler=handle)


def _expectations(args: argparse.Namespace) -> list[Expectation] | None:
    """The expected statuses to judge with, read and never written into the store; None: the store's."""
    if args.no_expected:
        return None
    path = Path(args.expected) if args.expected else Path(DEFAULT_FILE)
    return load_expected_file(path) if args.expected or path.exists() else None


def handle(args: argparse.Namespace) -> int:
    thresholds = load_thresholds(args.thresholds)
    expectations = _expectations(args)
    Session = open_store(args.db, StoreAccess.EXISTING)
    with Session.begin() as session:
        summaries = summarize(session, args.run, args.label, args.cell, latest_only=not args.all)
        summaries, broken = judge(session, summaries, thresholds, expectations, [*args.label, *args.run])
    selection = selection_text(args, ("run", "label", "cell"))
    if not summaries and selection:
        raise MatrixError(f"no run in the store matches {selection}")
    if args.json:
        print_json([s.to_dict() for s in summaries])
    elif not summaries:
        info("grace-matrix: the store holds no runs (run `nox -s matrix` or `grace-matrix run` first)")
    else:
        print_table([s.row() for s in summaries], list(COLUMNS))
    if not args.check:
        return 0
    for cell in broken:
        info(f"grace-matrix: {cell.line()}")
    index = Path(DEFAULT_OUT) / "index.html"
    for line in verdict_block(summaries, broken, index.as_posix(), rendered=index.exists()):
        info(f"grace-matrix: {line}")
    return 1 if broken else 0
