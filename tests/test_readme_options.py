"""The README's options table lists exactly the fields of ``GraceOptions``, each once, with its default.

The table sits under the README's ``### Options`` heading; each row is
``| `name` | `default` | meaning |``, the default written as the field's default expression in
``grace/options.py`` (``4 << 20``, not ``4194304``), so the docs cannot drift from the code.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from grace.options import GraceOptions

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
OPTIONS_SOURCE = ROOT / "grace" / "options.py"
HEADING = "### Options"
ROW = re.compile(r"^\|\s*`(?P<name>\w+)`\s*\|\s*`(?P<default>[^`]+)`\s*\|(?P<meaning>.*)\|\s*$")


def readme_table_lines() -> list[str]:
    """The lines of the first Markdown table after the options heading (header and rule included)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines.count(HEADING) == 1, f"README.md must have exactly one {HEADING!r} heading"
    start = lines.index(HEADING) + 1
    while start < len(lines) and not lines[start].startswith("|"):
        assert not lines[start].startswith("#"), f"no table under {HEADING!r} before the next heading"
        start += 1
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    assert end > start, f"no table under {HEADING!r} in README.md"
    return lines[start:end]


def readme_rows() -> list[tuple[str, str, str]]:
    """(name, default, meaning) of every row of the options table, in order."""
    header, rule, *rows = readme_table_lines()
    assert [c.strip() for c in header.strip("|").split("|")] == ["option", "default", "meaning"]
    assert set(rule) <= set("|-: "), f"the options table's second line is not a rule: {rule!r}"
    parsed = []
    for line in rows:
        match = ROW.match(line)
        assert match, f"options table row is not | `name` | `default` | meaning |: {line!r}"
        parsed.append((match["name"], match["default"], match["meaning"].strip()))
    return parsed


def source_defaults() -> dict[str, str]:
    """Each ``GraceOptions`` field's default expression, as written in grace/options.py."""
    source = OPTIONS_SOURCE.read_text(encoding="utf-8")
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GraceOptions")
    out = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            text = ast.get_source_segment(source, node.value)
            assert text is not None
            out[node.target.id] = text
    return out


def test_every_field_listed_once() -> None:
    names = [name for name, _, _ in readme_rows()]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates, f"options listed more than once in README.md: {duplicates}"
    fields = list(GraceOptions.field_names())
    missing = [f for f in fields if f not in names]
    unknown = [n for n in names if n not in fields]
    assert not missing and not unknown, (
        f"README.md's options table must list exactly GraceOptions' fields: missing {missing}, "
        f"not fields {unknown}"
    )


@pytest.mark.parametrize("field", dataclasses.fields(GraceOptions), ids=lambda f: f.name)
def test_default_as_in_code(field: dataclasses.Field[object]) -> None:
    rows = {name: default for name, default, _ in readme_rows()}
    if field.name not in rows:
        pytest.fail(f"{field.name} is not in README.md's options table")
    written = rows[field.name]
    assert written == source_defaults()[field.name], (
        f"README.md gives {field.name} the default {written!r}; grace/options.py has "
        f"{source_defaults()[field.name]!r}"
    )
    value = eval(compile(ast.parse(written, mode="eval"), "README.md", "eval"), {"__builtins__": {}})
    assert value == field.default and type(value) is type(field.default)


def test_every_row_has_a_meaning() -> None:
    empty = [name for name, _, meaning in readme_rows() if not meaning]
    assert not empty, f"options without a meaning in README.md: {empty}"
