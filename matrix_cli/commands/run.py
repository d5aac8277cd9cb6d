"""``grace-matrix run``: run one cell's suites in the current environment and record them."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from matrix.cells import default_config_path, load_matrix
from matrix.errors import ConfigError
from matrix.infiles import read_text
from matrix.runner import ENV_CELL, ENV_LABEL, check_workers, record_install_failure, run_cell
from matrix.store.access import check_label
from matrix.store.db import default_url, open_store
from matrix.store.models import RunStatus
from matrix_cli.commands._output import info, print_json


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a cell's suites here and record them",
        description="Run the suites of one cell in the current environment (pytest with the recorder); "
        "arguments after -- go to pytest.",
    )
    parser.add_argument("--cell", default=None, help=f"cell id (default: {ENV_CELL} or 'current')")
    parser.add_argument("--label", default=None, help=f"run label (default: {ENV_LABEL})")
    parser.add_argument("-n", "--workers", default="auto", help="pytest-xdist workers; 0 for one process")
    parser.add_argument(
        "--install-failed",
        metavar="MESSAGE",
        default=None,
        help="do not run: record that the cell's environment could not be built, with this message "
        "(@FILE reads it from a file)",
    )
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then arguments for pytest")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    config_path = Path(args.config) if args.config else default_config_path()
    matrix = load_matrix(config_path)
    cell = matrix.cell(args.cell or os.environ.get(ENV_CELL) or "current")
    label = args.label or os.environ.get(ENV_LABEL)
    check_label(label)
    check_workers(args.workers)
    url = args.db or default_url()
    Session = open_store(url)
    if args.install_failed is not None:
        message = args.install_failed
        if message.startswith("@"):
            try:
                message = read_text(Path(message[1:]), errors="replace")
            except OSError as exc:
                raise ConfigError(f"--install-failed {message}: {exc.strerror}") from None
        result = record_install_failure(Session, cell, message, label)
    else:
        pytest_args = list(args.pytest_args)
        if pytest_args[:1] == ["--"]:
            pytest_args = pytest_args[1:]
        project_root = config_path.resolve().parent
        result = run_cell(Session, url, cell, project_root, label, args.workers, pytest_args)
    if args.json:
        print_json({**result.__dict__, "status": result.status.value})
    else:
        info(
            f"grace-matrix: cell {result.cell_id}: run {result.uid} {result.status.value}"
            + (f" ({result.message})" if result.message else "")
        )
    return 0 if result.status in (RunStatus.COMPLETE, RunStatus.INSTALL_FAILED) else 1
