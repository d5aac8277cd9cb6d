"""``grace-matrix merge``: copy every run of other stores into the store (one transaction)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from matrix.errors import ConfigError
from matrix.store.db import display_url, open_store
from matrix.transfer import merge_stores
from matrix_cli.commands._output import info, print_json


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("merge", help="merge other stores into the store given by --db")
    parser.add_argument("sources", nargs="+", metavar="STORE", help="store URL, or the path of a SQLite file")
    parser.set_defaults(handler=handle)


def source_url(source: str) -> str:
    if "://" in source:
        return source
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"{source}: no such store file (give a SQLite file or a database URL)")
    return f"sqlite:///{path.resolve()}"


def handle(args: argparse.Namespace) -> int:
    urls = [source_url(s) for s in args.sources]
    target = open_store(args.db)
    stats = merge_stores(target, urls, progress=sys.stderr.isatty())
    if args.json:
        print_json(stats.to_dict())
    else:
        info(
            f"grace-matrix: merged {', '.join(display_url(u) for u in urls)}: {stats.runs_added} runs added, "
            f"{stats.runs_updated} updated, {stats.runs_present} already present; "
            f"{sum(stats.rows_added.values())} rows added"
        )
    return 0
