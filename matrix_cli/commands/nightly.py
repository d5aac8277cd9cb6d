"""``grace-matrix nightly``: the nightly pipeline on this machine (cells as separate processes)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

from matrix.cells import CellKind, default_config_path, load_matrix
from matrix.errors import ConfigError
from matrix.runner import check_workers
from matrix.store.access import check_label
from matrix.store.db import ENV_HOME, default_url
from matrix_cli.commands._output import info, print_json
from matrix_cli.commands.dashboard import publish


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "nightly",
        help="run the nightly pipeline here: cells as separate processes, one store, regressions, dashboard",
        description="Run the selected cells as separate processes (at most --jobs at once), all recording "
        "under one label into one store: straight into it when it is a server such as PostgreSQL "
        "(--db postgresql+psycopg://...), else through a SQLite store per cell whose exports are then "
        "merged. Then judge regressions and render the dashboard. Arguments after -- go to pytest.",
    )
    parser.add_argument(
        "--cell",
        "--cells",
        dest="cells",
        action="append",
        default=[],
        metavar="ID[,ID...]",
        help="cells to run (repeatable; --cells is the same option)",
    )
    parser.add_argument(
        "--tag", action="append", default=[], help="cells with this tag (repeatable; default: nightly)"
    )
    parser.add_argument("-j", "--jobs", type=int, default=1, help="cells running at once (default: 1)")
    parser.add_argument("--label", default=None, help="label of every run (default: nightly-<UTC time>)")
    parser.add_argument(
        "--store-mode",
        choices=["shared", "per-cell"],
        default=None,
        help="shared: cells write into --db at once; per-cell: SQLite per cell, exported and merged "
        "(default: shared for a server, per-cell for SQLite)",
    )
    parser.add_argument(
        "--via",
        choices=["nox", "run"],
        default="nox",
        help='nox: each cell in its own environment (nox -s "cell(ID)"); run: in this interpreter '
        "(grace-matrix run --cell ID)",
    )
    parser.add_argument(
        "-n", "--workers", default=None, help="pytest-xdist workers per cell (default: the cell command's)"
    )
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="limit per cell")
    parser.add_argument("--workdir", default=None, help="logs, per-cell stores, exports, site")
    parser.add_argument("--no-report", action="store_true", help="skip regressions and dashboard")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then arguments for pytest")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from matrix.nightly import (
        NightlyOptions,
        StoreMode,
        Via,
        default_label,
        default_mode,
        run_nightly,
        select_cells,
    )

    config_path = Path(args.config) if args.config else default_config_path()
    matrix = load_matrix(config_path)
    ids = [i.strip() for group in args.cells for i in group.split(",") if i.strip()]
    via = Via(args.via)
    cells, passed_over = select_cells(matrix, ids, args.tag, via)
    for cell_id, reason in passed_over:
        info(f"grace-matrix: cell {cell_id} cannot run here: {reason}")
    if via is Via.NOX and not (config_path.resolve().parent / "noxfile.py").is_file():
        raise ConfigError(
            f"no noxfile.py beside {config_path}; use --via run to run cells in this interpreter"
        )
    if not cells:
        raise ConfigError("no cell to run: check --cells / --tag")
    if args.jobs < 1:
        raise ConfigError(f"--jobs {args.jobs}: give at least 1")
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ConfigError(f"--timeout {args.timeout}: give a number of seconds above zero")
    label = args.label or default_label()
    check_label(label)
    check_workers(args.workers)
    if via is Via.RUN and any(c.kind is not CellKind.CURRENT for c in cells):
        info("grace-matrix: --via run records every cell with this interpreter's torch and Triton")
    target = args.db or default_url()
    mode = StoreMode(args.store_mode) if args.store_mode else default_mode(target)
    home = Path(os.environ.get(ENV_HOME, ".grace-matrix"))
    workdir = Path(args.workdir) if args.workdir else home / "nightly" / label
    pytest_args = list(args.pytest_args)
    if pytest_args[:1] == ["--"]:
        pytest_args = pytest_args[1:]
    options = NightlyOptions(
        cells=cells,
        label=label,
        target_url=target,
        mode=mode,
        via=via,
        jobs=args.jobs,
        workdir=workdir.resolve(),
        config_path=config_path,
        workers=args.workers,
        timeout_s=args.timeout,
        pytest_args=tuple(pytest_args),
        report=not args.no_report,
    )
    info(
        f"grace-matrix: nightly {label}: {len(cells)} cells ({', '.join(c.id for c in cells)}), "
        f"{args.jobs} at once, {mode.value} store, via {via.value}"
    )
    report = run_nightly(options, progress=lambda line: info(f"grace-matrix: {line}"), publish=publish)
    if args.json:
        print_json(report.to_dict())
    else:
        failed = [c.cell_id for c in report.cells if not c.ok]
        verdict = "ok" if report.ok else "FAILED"
        details = []
        if failed:
            details.append(f"cells failed: {', '.join(failed)}")
        if report.new_regressions:
            details.append("new regressions (see regressions.txt)")
        if report.broken:
            details.append(f"broken cells: {', '.join(b.cell_id for b in report.broken)}")
        info(
            f"grace-matrix: nightly {label} {verdict}"
            + (f": {'; '.join(details)}" if details else "")
            + f"; files in {options.workdir}"
        )
    return 0 if report.ok else 1
