"""Loading an optional technique package (``grace.cgct``, ``grace.pi``) so that its failure costs only it.

Problem: CGCT and PI depend on the most version-sensitive parts of torch, Triton and CUDA. A release
that breaks one of them at import time (a moved private module, a syntax a newer Python rejects, a
half-installed dependency) must not break ``import grace``, the backend or the other techniques: the
backend then compiles without that technique and records why.

Design: the runtime reaches a technique package only by name, through ``load_seam``, which imports it
and checks the entry points it needs; any failure becomes a ``SkipReason`` (``cgct_unavailable`` or
``pi_unavailable``) that the caller stores and logs. This module imports nothing but ``grace.reasons``,
so the backend, ``grace.techniques`` and the runtime can use it without importing each other. Within
a technique package, its own modules import each other directly.

Invariants:
- No module outside ``grace.cgct`` imports ``grace.cgct``, and none outside ``grace.pi`` imports
  ``grace.pi``, except through ``load_seam`` (see Note: [PI seam] in grace.capture for what PI's entry
  point receives and returns).
- ``load_seam`` never raises: what the import raises is the reason's detail.
"""

from __future__ import annotations

import importlib
from typing import Any

from grace.reasons import SkipCode, SkipReason


def load_seam(package: str, *attributes: str) -> tuple[Any, SkipReason | None]:
    """Import ``grace.<package>`` and check it has callables ``attributes``.

    ``package`` is ``"cgct"`` or ``"pi"``, or one of their modules (``"pi.scan"``) for a part of the
    runtime that shares a technique's machinery. Returns (module, None), or (None, the reason it cannot
    be used)."""
    code = SkipCode.CGCT_UNAVAILABLE if package.split(".")[0] == "cgct" else SkipCode.PI_UNAVAILABLE
    try:
        module = importlib.import_module(f"grace.{package}")
    except Exception as exc:
        return None, SkipReason(code, f"grace.{package} not available: {type(exc).__name__}: {exc}")
    missing = [a for a in attributes if not callable(getattr(module, a, None))]
    if missing:
        return None, SkipReason(code, f"grace.{package} not available: it has no {', '.join(missing)}()")
    return module, None
