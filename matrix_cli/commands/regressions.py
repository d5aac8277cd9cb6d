"""``grace-matrix regressions``: judge the latest run of every cell (or chosen runs) against expected
statuses, a baseline run and the nightly history; exit 1 when a new regression is found.

Thin: parses, opens the store, calls ``matrix.regressions.report.detect`` and prints. The expected-status
file (``expected.toml`` in the current directory by default) is loaded into the store first, in its own
transaction, so the dashboards render the same expectations.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from matrix.regressions.expected import DEFAULT_FILE, load_expected_file, sync_expected
from matrix.regressions.report import detect, report_to_json
from matrix.regressions.text_report import report_text
from matrix.regressions.thresholds import Thresholds, load_thresholds
from matrix.store.db import StoreAccess, open_store
from matrix_cli.commands._output import print_json, print_text


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Options shared with ``grace-matrix dashboard``."""
    parser.add_argument(
        "--thresholds",
        metavar="PATH",
        default=None,
        help="regression thresholds file (default: matrix/thresholds.toml shipped with grace-matrix)",
    )
    add_expected_options(parser)


def add_expected_options(parser: argparse.ArgumentParser) -> None:
    """``--expected PATH`` / ``--no-expected``: which expected statuses a command judges with."""
    expected = parser.add_mutually_exclusive_group()
    expected.add_argument(
        "--expected",
        metavar="PATH",
        default=None,
        help=f"expected statuses to load into the store first (default: ./{DEFAULT_FILE} when it exists)",
    )
    expected.add_argument(
        "--no-expected",
        action="store_true",
        help="judge against the expected statuses already in the store",
    )


def prepare(args: argparse.Namespace) -> tuple[sessionmaker[Session], Thresholds]:
    """Open the store, load thresholds and sync the expected-status file (see ``add_common_options``)."""
    thresholds = load_thresholds(args.thresholds)
    store = open_store(args.db, StoreAccess.EXISTING)
    if not args.no_expected:
        path = Path(args.expected) if args.expected else Path(DEFAULT_FILE)
        if args.expected or path.exists():
            entries = load_expected_file(path)
            with store.begin() as session:
                sync_expected(session, entries)
    return store, thresholds


def run_regressions(args: argparse.Namespace) -> int:
    """Exit status 1 when a new regression is found; errors propagate as ``MatrixError``s."""
    store, thresholds = prepare(args)
    with store() as session:
        report = detect(session, thresholds, run_spec=args.run, baseline_spec=args.baseline)
    if args.json:
        print_json(report_to_json(report))
    else:
        print_text(report_text(report))
    return 1 if report.new_regressions else 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "regressions",
        help="flag regressions of the latest runs (exit 1 when a new one is found)",
        description="Judge runs against expected statuses, a baseline run (median ratio past a threshold AND "
        "Mann-Whitney U significant) and the nightly history (lasting steps). Exit 1 when a new "
        "regression is found, 0 when none, 2 on a configuration error. --json prints the report as JSON.",
    )
    parser.add_argument(
        "--run",
        metavar="RUN",
        default=None,
        help="run uid, uid prefix or label to judge (default: the latest finished run of every cell)",
    )
    parser.add_argument(
        "--baseline",
        metavar="RUN",
        default=None,
        help="run uid, uid prefix or label to compare with (default: the previous complete run of the cell)",
    )
    add_common_options(parser)
    parser.set_defaults(handler=run_regressions)
