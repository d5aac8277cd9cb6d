"""``grace-matrix cells``: the cells of matrix.toml (id, torch, triton, cuda, kind, tags)."""

from __future__ import annotations

import argparse
from typing import Any

from matrix.cells import Matrix, load_matrix
from matrix_cli.commands._output import print_json, print_table


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("cells", help="list the cells of the matrix")
    parser.add_argument("--tag", action="append", default=[], help="only cells with this tag (repeatable)")
    parser.add_argument("--cell", action="append", default=[], help="only this cell id (repeatable)")
    parser.set_defaults(handler=handle)


def cell_rows(matrix: Matrix, tags: list[str], ids: list[str]) -> list[dict[str, Any]]:
    cells = matrix.select(tags, ids) if tags or ids else matrix.cells
    rows = []
    for cell in cells:
        row = cell.to_dict()
        exclusion = matrix.exclusion_for(cell)
        row["excluded_here"] = exclusion.reason if exclusion else None
        row["nox_session"] = f"cell({cell.id})"
        rows.append(row)
    return rows


def handle(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.config)
    rows = cell_rows(matrix, args.tag, args.cell)
    if args.json:
        print_json(rows)
    else:
        print_table(rows, ["id", "kind", "torch", "triton", "cuda", "tags", "excluded_here"])
    return 0
