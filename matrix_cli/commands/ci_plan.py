"""``grace-matrix ci-plan``: render the nightly workflow from matrix.toml; ``--check`` it, ``--write`` it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from matrix.cells import default_config_path, load_matrix
from matrix.ciplan import WORKFLOW_PATH, build_workflow, drift, render
from matrix.errors import MatrixError
from matrix.outfiles import write_document
from matrix.runners import load_runners
from matrix_cli.commands._output import info, print_json


class WorkflowDrift(MatrixError):
    """The committed workflow differs from what matrix.toml and runners.toml give; exit status 1."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "ci-plan",
        help="render the nightly CI workflow from matrix.toml",
        description="Render .github/workflows/nightly.yml from matrix.toml and matrix/runners.toml: one job "
        "per cell on runners chosen by labels, and a final job that merges, judges regressions and "
        "publishes the dashboard. Without --check or --write, print it.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when the committed workflow drifts")
    mode.add_argument("--write", action="store_true", help="write the workflow file")
    parser.add_argument("--runners", metavar="PATH", default=None, help="runner labels and job settings")
    parser.add_argument(
        "--output",
        metavar="PATH",
        default=None,
        help=f"the workflow file (default: {WORKFLOW_PATH} beside matrix.toml)",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    config_path = Path(args.config) if args.config else default_config_path()
    matrix = load_matrix(config_path)
    runners = load_runners(args.runners)
    target = Path(args.output) if args.output else config_path.resolve().parent / WORKFLOW_PATH
    text = render(matrix, runners)
    if args.check:
        diff = drift(text, target)
        if diff:
            for line in diff[:60]:
                info(line)
            if len(diff) > 60:
                info(f"... {len(diff) - 60} more diff lines")
            raise WorkflowDrift(
                f"{target} is out of date with {matrix.source}; "
                "run `grace-matrix ci-plan --write` and commit it"
            )
        info(f"grace-matrix: {target} matches {matrix.source}")
    elif args.write:
        write_document(target, text)  # atomically; never over a folder or a store
        info(f"grace-matrix: wrote {target}")
    if args.json:
        print_json(build_workflow(matrix, runners)[1].to_dict())
    elif not (args.check or args.write):
        sys.stdout.write(text)
    return 0
