"""Machine paths out of stored text.

Problem: what a test prints (a traceback, an exception message) names the machine it ran on: the
checkout's directory, the interpreter's prefix, site-packages, the home directory. Stored results
travel (exports under results/, merged nightly stores, dashboards), and a path says nothing useful
about a failure while it makes the same failure on two machines look different.

Design: the recorder passes every free-text value it stores through ``redact``, which replaces the
known roots of the running process by placeholders (``<repo>``, ``<site-packages>``, ``<env>``, ``~``),
longest root first so that a site-packages inside the environment is named as such.

Invariant: only whole path prefixes are replaced (a root followed by a separator or the end); the rest
of the text is kept byte for byte.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def default_roots() -> tuple[tuple[str, str], ...]:
    """(root, placeholder) pairs for this process, longest root first."""
    roots: dict[str, str] = {}
    for key in ("purelib", "platlib"):
        roots[sysconfig.get_paths()[key]] = "<site-packages>"
    roots[str(REPO_ROOT)] = "<repo>"
    roots[sys.prefix] = "<env>"
    home = os.path.expanduser("~")
    if home not in ("/", "~"):
        roots[home] = "~"
    cleaned = {os.path.normpath(root): name for root, name in roots.items() if root and root != "/"}
    return tuple(sorted(cleaned.items(), key=lambda item: len(item[0]), reverse=True))


def _pattern(roots: tuple[tuple[str, str], ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(root) for root, _ in roots)
    return re.compile(f"(?:{alternatives})(?=[/\\\\]|$|[^\\w.-])")


def redact(text: str | None, roots: tuple[tuple[str, str], ...] | None = None) -> str | None:
    """``text`` with each known root replaced by its placeholder."""
    if not text:
        return text
    roots = roots if roots is not None else default_roots()
    if not roots:
        return text
    names = dict(roots)
    return _pattern(roots).sub(lambda match: names[match.group(0)], text)


def redact_value(value: Any, roots: tuple[tuple[str, str], ...] | None = None) -> Any:
    """``redact`` applied to every string inside lists and mappings (record details)."""
    if isinstance(value, str):
        return redact(value, roots)
    if isinstance(value, Mapping):
        return {key: redact_value(item, roots) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_value(item, roots) for item in value]
    return value
