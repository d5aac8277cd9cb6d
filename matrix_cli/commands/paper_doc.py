"""``grace-matrix paper-doc``: write docs/PAPER.md, the GraCE paper's figures beside ours (never edited
by hand). Thin: reads matrix/paper.toml (``matrix.paper``), picks the head run of every GPU cell (or of the
selected runs), compares (``matrix.paper_compare``) and writes (``matrix.paper_doc``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from matrix.errors import ConfigError
from matrix.outfiles import write_document
from matrix.paper import find_paper
from matrix.paper_compare import compare_run, head_runs
from matrix.paper_doc import render_paper_markdown
from matrix_cli.commands.report import open_selected_store

DEFAULT_OUTPUT = "docs/PAPER.md"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "paper-doc", help=f"generate {DEFAULT_OUTPUT}: the GraCE paper's figures beside the head run's"
    )
    parser.add_argument(
        "-o",
        "--output",
        default=DEFAULT_OUTPUT,
        help=f"file to write (default {DEFAULT_OUTPUT}; - for stdout)",
    )
    parser.add_argument(
        "--paper", default=None, help="the paper's figures (default: matrix/paper.toml, shipped)"
    )
    parser.add_argument("--run", action="append", default=[], help="only runs with this uid (repeatable)")
    parser.add_argument("--label", action="append", default=[], help="only runs with this label (repeatable)")
    parser.add_argument("--cell", action="append", default=[], help="only this cell id (repeatable)")
    parser.add_argument(
        "--input", action="extend", nargs="+", default=[], metavar="FILE",
        help="read runs from these export files (grace-matrix export, e.g. results/) instead of the store",
    )  # fmt: skip
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    paper = find_paper(args.paper)  # a bad file fails before the store is opened
    Session = open_selected_store(args)
    with Session() as session:
        runs = head_runs(session, args.run, args.label, args.cell)
        if not runs and (args.run or args.label or args.cell):
            raise ConfigError("the runs --run/--label/--cell select ran on no GPU: nothing to compare")
        comparisons = [compare_run(session, paper, run) for run in runs]
    text = render_paper_markdown(paper, comparisons)
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    target = Path(args.output)
    write_document(target, text)
    figures = sum(1 for c in comparisons for f in c.figures if f.ours.value is not None)
    if getattr(args, "json", False):
        summary = {"output": str(target), "runs": [r.uid for r in runs], "figures_measured": figures}
        json.dump(summary, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        total = len(paper.figures) * len(comparisons)
        measured = f"{figures} of {total} paper figures measured in {len(runs)} run(s)"
        print(f"grace-matrix: wrote {target}: {measured}", file=sys.stderr)
    return 0
