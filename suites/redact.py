"""Machine paths out of text: whole path prefixes replaced by placeholders.

Problem: a traceback or a command line names the machine it ran on (the checkout, the interpreter's
prefix, a temporary folder); stored results travel, and a path makes the same failure on two machines
look different.

Design: ``ordered_roots`` normalises (root, placeholder) pairs and orders them longest first, so that a
folder inside another root is named as itself; ``redact_text`` replaces each root where it is a whole
path prefix (followed by a separator, the end, or a character no path name holds); ``redact_tree``
applies it to every string inside mappings and lists. Callers choose the roots: the recorder uses this
process's (matrix.redact), the TP launcher its launch's (suites.tp.launch).

Invariant: the rest of the text is kept byte for byte; the filesystem root itself is never replaced.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from typing import Any

Roots = tuple[tuple[str, str], ...]


def ordered_roots(roots: Mapping[str, str]) -> Roots:
    """(root, placeholder) pairs, normalised, without empty roots or ``/``, longest root first."""
    cleaned = {os.path.normpath(root): name for root, name in roots.items() if root}
    cleaned.pop("/", None)
    return tuple(sorted(cleaned.items(), key=lambda item: len(item[0]), reverse=True))


@functools.lru_cache(maxsize=32)
def _pattern(roots: Roots) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(root) for root, _ in roots)
    return re.compile(f"(?:{alternatives})(?=[/\\\\]|$|[^\\w.-])")


def redact_text(text: str, roots: Roots) -> str:
    """``text`` with each root of ``roots`` (from ``ordered_roots``) replaced by its placeholder."""
    if not text or not roots:
        return text
    names = dict(roots)
    return _pattern(roots).sub(lambda match: names[match.group(0)], text)


def redact_tree(value: Any, roots: Roots, keys: bool = False) -> Any:
    """``redact_text`` applied to every string inside mappings and lists (and to mapping keys with
    ``keys``); anything else is returned as it is."""
    if isinstance(value, str):
        return redact_text(value, roots)
    if isinstance(value, Mapping):
        key = (lambda k: redact_tree(k, roots, keys)) if keys else (lambda k: k)
        return {key(k): redact_tree(v, roots, keys) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_tree(item, roots, keys) for item in value]
    return value
