"""A small, deterministic YAML writer for generated CI workflows.

Problem: the nightly workflow is generated and committed, and a test compares the committed file with a
fresh rendering byte for byte. The text must therefore depend only on the data (no library version may
change quoting or line wrapping), be readable in a diff, and mean to every YAML reader what the data
says: GitHub Actions reads YAML 1.2, PyYAML reads YAML 1.1, where ``on``, ``yes`` and ``no`` are booleans.

Design: mappings and sequences in block style, keys in insertion order; a list of short plain scalars
in flow style (``runs-on: [self-hosted, gpu-h100]``); multi-line strings as literal blocks (``|``);
any other string plain only when it is unambiguous in both YAML versions, else double-quoted with every
non-printable character escaped.

Invariant: ``yaml.safe_load(dump(data)) == data`` for the types written here (dict with str keys, list,
str, int, bool); anything else raises ``TypeError``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./@ -]*")  # whole value: fullmatch (``$`` allows a final newline)
_KEYWORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}
_FLOW_WIDTH = 100
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t"}


def scalar(value: str | int | bool) -> str:
    """One scalar as YAML text (see the module docstring for the quoting rule)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        raise TypeError(f"cannot write {type(value).__name__} {value!r} as a YAML scalar")
    plain = (
        bool(_PLAIN.fullmatch(value))
        and value.lower() not in _KEYWORDS
        and not value.endswith(" ")
        and ": " not in value
        and " #" not in value
    )
    return value if plain else quote(value)


def quote(value: str) -> str:
    """A double-quoted scalar: printable characters as they are, everything else escaped."""
    out = ['"']
    for ch in value:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable() and ch not in "\ufeff\ufffe\uffff" and ord(ch) != 0x7F:
            out.append(ch)
        else:
            code = ord(ch)
            out.append(
                f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
            )
    out.append('"')
    return "".join(out)


def _flow(items: Sequence[Any]) -> str | None:
    if not items or not all(isinstance(i, str) for i in items):
        return None
    text = "[" + ", ".join(scalar(i) for i in items) + "]"
    return text if len(text) <= _FLOW_WIDTH else None


def _literal_safe(text: str) -> bool:
    """Whether a literal block keeps ``text`` exactly: printable lines, no leading blank or space, no
    trailing blank lines (the block indentation and chomping rules would change those)."""
    if text.endswith("\n\n") or text.startswith((" ", "\n", "\t")):
        return False
    return all(line.isprintable() and line == line.rstrip() for line in text.split("\n"))


def _literal(text: str, indent: int) -> str:
    chomp = "" if text.endswith("\n") else "-"
    pad = " " * indent
    body = "".join(f"{pad}{line}\n" if line else "\n" for line in text.removesuffix("\n").split("\n"))
    return f"|{chomp}\n{body}"


def _value(value: Any, indent: int) -> str:
    """Text after ``key:`` or ``- ``: either ' scalar\\n' or '\\n' plus an indented block."""
    if isinstance(value, Mapping):
        if not value:
            return " {}\n"
        return "\n" + _mapping(value, indent)
    if isinstance(value, (list, tuple)):
        if not value:
            return " []\n"
        flow = _flow(value)
        if flow is not None:
            return f" {flow}\n"
        return "\n" + _sequence(value, indent)
    if isinstance(value, str) and "\n" in value and _literal_safe(value):
        return " " + _literal(value, indent)
    return f" {scalar(value)}\n"


def _mapping(data: Mapping[str, Any], indent: int) -> str:
    pad = " " * indent
    out = []
    for key, value in data.items():
        if not isinstance(key, str):
            raise TypeError(f"mapping keys must be strings, got {key!r}")
        out.append(f"{pad}{scalar(key)}:{_value(value, indent + 2)}")
    return "".join(out)


def _sequence(items: Sequence[Any], indent: int) -> str:
    pad = " " * indent
    out = []
    for item in items:
        if isinstance(item, Mapping) and item:
            # First key on the dash line, the rest aligned under it.
            block = _mapping(item, indent + 2)
            out.append(f"{pad}- {block[indent + 2 :]}")
        else:
            out.append(f"{pad}-{_value(item, indent + 2)}")
    return "".join(out)


def dump(data: Mapping[str, Any], header: str = "") -> str:
    """A YAML document for ``data``; ``header`` lines are written first as comments."""
    comments = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return comments + _mapping(data, 0)
