"""Stored text on its way in and out: the one place that decides which characters pass.

Problem: what a test prints is hostile text. On the way into the store, PostgreSQL refuses NUL in text
and JSON and neither driver can encode a lone surrogate, so a single character cost a whole row on one
database and a whole export on the other. On the way out, the same text lands in an Atom feed (XML 1.0
forbids most control characters), in Markdown documents (a pipe or a tag breaks the table) and in
terminals and CI logs, where an ANSI escape repaints the screen and a line starting with ``::`` is a
workflow command.

Design: one function per destination, all here. ``store_text`` is applied by the column types of the
store (``matrix.store.models``) to every text value and every string inside a JSON value, on every
database: a refused character becomes U+FFFD, the rest is kept byte for byte. ``terminal_text``,
``xml_text`` and ``markdown_text`` render a refused or active character visibly (``\\x1b``) instead of
dropping it, so the evidence stays readable.

Invariants: ``store_text`` is idempotent and keeps every character both databases accept; the output
functions never let a control character other than newline and tab through (``markdown_text`` not even
those: one line), and ``terminal_text`` never yields a line that starts with a workflow command marker.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"

_REFUSED_BY_STORE = re.compile("[\x00\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_COMMAND_LINE = re.compile(r"^(\s*)(::|##\[)", re.MULTILINE)


def store_text(text: str) -> str:
    """``text`` as every store database accepts it: NUL and lone surrogates become U+FFFD."""
    return _REFUSED_BY_STORE.sub(REPLACEMENT, text)


def store_value(value: Any) -> Any:
    """``store_text`` applied to every string (keys too) inside JSON-like lists and mappings."""
    if isinstance(value, str):
        return store_text(value)
    if isinstance(value, dict):
        return {store_value(k): store_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [store_value(v) for v in value]
    return value


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_text(text: str) -> str:
    """``text`` safe to print to a terminal or a CI log: control characters (ANSI escapes, carriage
    returns) shown as ``\\xNN``, and a line that a CI runner would read as a workflow command
    (``::error::``, ``##[group]``) prefixed with a backslash."""
    return _COMMAND_LINE.sub(r"\1\\\2", _CONTROL.sub(_visible, text))


def xml_text(text: str) -> str:
    """``text`` with every character XML 1.0 forbids (and the C1 controls) shown as ``\\xNN``; markup
    is escaped by the template engine."""
    return _NOT_XML.sub(_visible, text)


def markdown_text(text: str | None) -> str:
    """One line of Markdown that shows ``text`` literally: backslashes and pipes escaped, angle brackets
    as entities, backticks as quotes (so no code span opens), control characters visible, whitespace
    runs as one space."""
    if not text:
        return ""
    escaped = text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    escaped = escaped.replace("`", "'")
    one_line = " ".join(escaped.split())
    return _CONTROL.sub(_visible, one_line)
