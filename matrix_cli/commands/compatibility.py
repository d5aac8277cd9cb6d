"""``grace-matrix compatibility``: write docs/COMPATIBILITY.md (which parts of GraCE work per cell, and
why each failure failed) from the store or from export files; never edited by hand.

Thin: parses, opens the store (``--input`` reads exports into a store in memory), loads the expected
statuses into it first as ``grace-matrix regressions`` does, calls ``matrix.compatibility.build_table``
and writes ``matrix.compatibility_doc.render_markdown`` atomically. ``--json`` prints the table on stdout.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from matrix.cells import default_config_path, load_matrix
from matrix.compatibility import build_table
from matrix.compatibility_doc import render_markdown
from matrix.errors import ConfigError
from matrix.outfiles import write_document
from matrix.regressions.expected import DEFAULT_FILE, load_expected_file, sync_expected
from matrix.regressions.status import Expectation
from matrix_cli.commands._output import info, print_json
from matrix_cli.commands.regressions import add_expected_options
from matrix_cli.commands.report import add_selection, open_selected_store

logger = logging.getLogger(__name__)

DEFAULT_OUTPUT = "docs/COMPATIBILITY.md"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compatibility",
        help=f"generate {DEFAULT_OUTPUT}: per cell, which parts of GraCE work and why each failure failed",
        description="Per cell (the latest finished run, or the runs selected), a verdict for each part of "
        "GraCE (import, backend, cgct, ptx, gpu) with counts, and every failure with its reason; failures "
        "that expected.toml covers are shown as expected. --json prints the table on stdout.",
    )
    parser.add_argument(
        "-o",
        "--output",
        default=None,
        help=f"file to write (default {DEFAULT_OUTPUT}; - for stdout)",
    )
    add_expected_options(parser)
    add_selection(parser)
    parser.set_defaults(handler=handle)


def load_expected(args: argparse.Namespace, store: sessionmaker[Session]) -> list[Expectation] | None:
    """The expected statuses to judge with: the file's, synced into the store when it is writable; None
    (those in the store) with ``--no-expected`` or when there is no file."""
    if args.no_expected:
        return None
    path = Path(args.expected) if args.expected else Path(DEFAULT_FILE)
    if not (args.expected or path.exists()):
        return None
    entries = load_expected_file(path)
    try:
        with store.begin() as session:
            sync_expected(session, entries)
    except OperationalError as exc:  # a read-only store: judge with the file, leave the store alone
        logger.warning("expected statuses not stored (%s); judging with %s", exc.orig, path)
    return entries


def matrix_order(config: str | None) -> list[str]:
    """Cell ids in matrix.toml order; none (natural order) when the default file is absent."""
    path = Path(config) if config else default_config_path()
    if not config and not path.exists():
        return []
    return list(load_matrix(path).ids)


def handle(args: argparse.Namespace) -> int:
    if args.json and args.output == "-":
        raise ConfigError("--json and -o - both write to stdout; give -o FILE with --json, or drop --json")
    order = matrix_order(args.config)
    store = open_selected_store(args)
    expectations = load_expected(args, store)
    with store() as session:
        table = build_table(session, args.run, args.label, args.cell, args.workload, expectations, order)
    text = render_markdown(table)
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    target = Path(args.output or DEFAULT_OUTPUT)
    write_document(target, text)  # atomically, with the umask's mode
    if args.json:
        print_json({"output": str(target), **table.to_dict()})
    else:
        info(f"grace-matrix: wrote the compatibility of {len(table.rows)} cell(s) to {target}")
    return 0
