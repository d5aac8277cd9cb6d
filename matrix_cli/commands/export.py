"""``grace-matrix export``: runs of the store as versioned JSON lines (to move or commit results)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from matrix.errors import ConfigError, MatrixError
from matrix.outfiles import write_output
from matrix.store.db import StoreAccess, open_store
from matrix.transfer import RunFilter, export_jsonl, selected_runs
from matrix_cli.commands._output import info, print_json, selection_text


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("export", help="write runs as JSON lines")
    parser.add_argument("-o", "--output", default="-", help="file to write (default: stdout)")
    parser.add_argument("--run", action="append", default=[], help="only this run uid (repeatable)")
    parser.add_argument("--label", action="append", default=[], help="only runs with this label (repeatable)")
    parser.add_argument("--cell", action="append", default=[], help="only runs of this cell id (repeatable)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    Session = open_store(args.db, StoreAccess.EXISTING)
    run_filter = RunFilter(uids=args.run, labels=args.label, cells=args.cell)
    selection = selection_text(args, ("run", "label", "cell"))
    with Session() as session:
        if selection and not selected_runs(session, run_filter):  # nothing written: a typo is no export
            raise MatrixError(f"no run in the store matches {selection}")
        if args.output == "-":
            counts = export_jsonl(session, sys.stdout, run_filter)
        else:
            target = Path(args.output)
            if not target.parent.is_dir():
                raise ConfigError(f"--output {target}: directory {target.parent} does not exist")
            # A file is written beside the target and renamed: an interrupted export leaves no half file.
            counts = write_output(
                target, lambda out: export_jsonl(session, out, run_filter, progress=sys.stderr.isatty())
            )
    return _report(args, counts)


def _report(args: argparse.Namespace, counts: Counter[str]) -> int:
    summary = {
        "runs": counts.get("run", 0),
        "rows": sum(n for k, n in counts.items() if k not in ("run", "header")),
    }
    if args.output != "-":
        if args.json:
            print_json({**summary, "output": args.output})
        else:
            info(f"grace-matrix: exported {summary['runs']} runs, {summary['rows']} rows to {args.output}")
    return 0
