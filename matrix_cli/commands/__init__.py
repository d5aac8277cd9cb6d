"""CLI subcommands, one module each.

Every module listed in ``COMMAND_MODULES`` exposes ``register(subparsers) -> None``, which adds its
parser with ``subparsers.add_parser(name, help=...)`` and sets ``handler`` to a function
``handler(args: argparse.Namespace) -> int`` (the exit status). Every subcommand parser already has the
common options ``--db URL``, ``--config PATH``, ``--json`` and ``-v`` (see ``matrix_cli.main``); a module may
redefine one of them. Handlers raise ``matrix.errors.MatrixError`` for anything the user can fix; the CLI
turns it into one line and the error's exit status.
"""

COMMAND_MODULES: tuple[str, ...] = (
    "cells",
    "run",
    "export",
    "ingest",
    "merge",
    "summary",
    "regressions",
    "dashboard",
    "pi_status",
    "report",
    "results_doc",
    "paper_doc",
    "compatibility",
    "ci_plan",
    "nightly",
    "check_store",
)
