"""Machine paths out of stored text.

Problem: what a test prints (a traceback, an exception message) names the machine it ran on: the
checkout's directory, the interpreter's prefix, site-packages, the home directory. Stored results
travel (exports under results/, merged nightly stores, dashboards), and a path says nothing useful
about a failure while it makes the same failure on two machines look different.

Design: the recorder passes every free-text value it stores through ``redact``, which replaces the
known roots of the running process by placeholders (``<repo>``, ``<site-packages>``, ``<env>``, ``~``),
longest root first so that a site-packages inside the environment is named as such (the mechanism is
suites.redact's, shared with the TP launcher; this module knows the roots of a recording process).

Invariant: only whole path prefixes are replaced (a root followed by a separator or the end); the rest
of the text is kept byte for byte.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

from suites.redact import Roots, ordered_roots, redact_text, redact_tree

REPO_ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def default_roots() -> Roots:
    """(root, placeholder) pairs for this process, longest root first."""
    roots: dict[str, str] = {}
    for key in ("purelib", "platlib"):
        roots[sysconfig.get_paths()[key]] = "<site-packages>"
    roots[str(REPO_ROOT)] = "<repo>"
    roots[sys.prefix] = "<env>"
    home = os.path.expanduser("~")
    if home not in ("/", "~"):
        roots[home] = "~"
    return ordered_roots(roots)


def redact(text: str | None, roots: Roots | None = None) -> str | None:
    """``text`` with each known root replaced by its placeholder."""
    if not text:
        return text
    return redact_text(text, roots if roots is not None else default_roots())


def redact_value(value: Any, roots: Roots | None = None) -> Any:
    """``redact`` applied to every string inside lists and mappings (record details)."""
    return redact_tree(value, roots if roots is not None else default_roots())
