"""Printing for the CLI: aligned text tables for people, JSON for scripts (the only printing code).

Everything printed for people passes ``matrix.text.terminal_text``: stored text (test output) reaches
terminals and CI logs, where a control character or a line read as a workflow command must stay inert.
JSON output escapes control characters itself.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from matrix.text import terminal_text


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    cells = [[_text(row.get(col)) for col in columns] for row in rows]
    widths = [max([len(col), *(len(r[i]) for r in cells)]) for i, col in enumerate(columns)]
    print_text("  ".join(col.ljust(w) for col, w in zip(columns, widths, strict=True)).rstrip())
    for r in cells:
        print_text("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def print_text(text: str) -> None:
    """Text for people on stdout (a report, a table line), made inert (``terminal_text``)."""
    print(terminal_text(text))


def selection_text(args: Any, options: Sequence[str]) -> str:
    """The selection options given on the command line, as typed (``--cell nosuch --label x``); ""
    when none was given."""
    return " ".join(f"--{name} {value}" for name in options for value in getattr(args, name, None) or ())


def info(message: str) -> None:
    """A progress or result line for people; on stderr so that ``--json`` output stays parseable."""
    print(terminal_text(message), file=sys.stderr)


def _text(value: Any) -> str:
    """One table cell on one line."""
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value).replace("\n", "\\n") or "-"
    return str(value).replace("\n", "\\n")
