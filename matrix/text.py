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
dropping it, so the evidence stays readable. ``clean_text`` is the one cleaner of what a reader shows of a
stored message (a reason, a first failure): one line, without machine paths or object addresses,
clipped (``one_line`` without the path rules). ``slug`` makes a file name or page anchor of a name.

Invariants: ``store_text`` is idempotent and keeps every character both databases accept; the output
functions never let a control character other than newline and tab through (``markdown_text`` not even
those: one line), and ``terminal_text`` never yields a line that starts with a workflow command marker.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from matrix.redact import redact

REPLACEMENT = "\ufffd"

_REFUSED_BY_STORE = re.compile("[\x00\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_COMMAND_LINE = re.compile(r"^(\s*)(::|##\[)", re.MULTILINE)
_SITE_PACKAGES = re.compile(r"(?:[A-Za-z]:)?[/\\][^\s'\"()<>:]*?[/\\](?:site|dist)-packages(?=[/\\])")
_HOME = re.compile(r"(?:/home|/Users|[A-Za-z]:\\Users)[/\\][^/\\\s'\"]+(?=[/\\])")
_PYTEST_TMP = re.compile(r"/tmp/pytest-of-[^/\s'\"]+(?:/pytest-\d+)?")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{8,}\b")  # "<object at 0x7f69...>" differs on every run
REASON_LIMIT = 200
_HASH_DIGITS = 16
_HASHED = re.compile(rf"-[0-9a-f]{{{_HASH_DIGITS}}}$")


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


def one_line(text: str | None, limit: int) -> str:
    """``text`` on one line (whitespace runs as one space), clipped to ``limit`` characters with "..."."""
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def clean_text(text: str | None, limit: int = REASON_LIMIT) -> str:
    """One line, without machine paths (``matrix.redact`` for this machine's roots; site-packages, home
    and pytest temporary folders of any machine) or object addresses, clipped to ``limit`` characters."""
    text = redact(text) or ""
    text = _SITE_PACKAGES.sub("<site-packages>", text)
    text = _HOME.sub("~", text)
    text = _PYTEST_TMP.sub("<tmp>", text)
    text = _ADDRESS.sub("0x...", text)
    return one_line(text, limit)


def slug(name: str, *, hashed: bool = False) -> str:
    """A file name for ``name``, readable and injective: a name made of ``[A-Za-z0-9_.-]`` (at most 80,
    not starting with a dot) is its own slug; any other name, or any name with ``hashed``, is its
    readable part plus ``-`` and 16 hex digits of its SHA-1. A name that itself ends like a hashed slug is
    hashed too, so a name kept as it is never equals the slug of another name (``slug("mlp large") !=
    slug(slug("mlp large"))``)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80]
    if hashed or safe != name or safe.startswith(".") or not safe or _HASHED.search(name):
        safe = f"{safe.lstrip('.')}-{hashlib.sha1(name.encode()).hexdigest()[:_HASH_DIGITS]}"
    return safe
