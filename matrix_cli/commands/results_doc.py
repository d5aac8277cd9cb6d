"""``grace-matrix results-doc``: write docs/RESULTS.md from the store (never edited by hand)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from matrix.outfiles import write_document
from matrix.report import render_markdown
from matrix_cli.commands.report import add_selection, selected_report

DEFAULT_OUTPUT = "docs/RESULTS.md"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("results-doc", help=f"generate {DEFAULT_OUTPUT} from the store")
    parser.add_argument(
        "-o",
        "--output",
        default=DEFAULT_OUTPUT,
        help=f"file to write (default {DEFAULT_OUTPUT}; - for stdout)",
    )
    add_selection(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    report = selected_report(args)
    text = render_markdown(report)
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    target = Path(args.output)
    write_document(target, text)
    summary = {"output": str(target), "rows": len(report.rows), "cells": report.cells()}
    if getattr(args, "json", False):
        json.dump(summary, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(
            f"grace-matrix: wrote {len(report.rows)} rows over {len(report.cells())} cell(s) to {target}",
            file=sys.stderr,
        )
    return 0
