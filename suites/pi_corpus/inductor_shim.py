"""Stand-ins for the torch modules an Inductor kernel source imports, so it compiles without torch.

Inductor's kernel sources import ``triton_helpers``, ``triton_heuristics``, ``libdevice``, ``tl_math``
and hint types from ``torch._inductor.runtime``. The corpus loader replaces those imports with this
module. The heuristics decorators here do not autotune: they keep their keyword arguments (the
``triton_meta`` with signature and specialisation) on the kernel so the suite compiles it exactly as
declared. Only the helpers the committed sources call are provided; a new source that calls another
one fails to load with a NameError that names it.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from grace.compat.triton import libdevice as _libdevice

libdevice = _libdevice()
tl_math = tl.math
INDUCTOR_META_ATTRIBUTE = "grace_inductor_heuristic"


class ReductionHint(enum.Enum):
    INNER = 0
    OUTER = 1
    OUTER_TINY = 2
    DEFAULT = 3


class TileHint(enum.Enum):
    SQUARE = 0
    DEFAULT = 1


class AutotuneHint(enum.Enum):
    ONE_ELEMENT_PER_THREAD = 0


def DeviceProperties(**fields: Any) -> dict[str, Any]:
    return dict(fields)


def _heuristic(kind: str) -> Callable[..., Callable[[Any], Any]]:
    def decorator_factory(*args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        def attach(fn: Any) -> Any:
            setattr(fn, INDUCTOR_META_ATTRIBUTE, {"kind": kind, **kwargs})
            return fn

        return attach

    return decorator_factory


triton_heuristics = types.ModuleType("triton_heuristics")
triton_heuristics.pointwise = _heuristic("pointwise")  # type: ignore[attr-defined]
triton_heuristics.reduction = _heuristic("reduction")  # type: ignore[attr-defined]
triton_heuristics.persistent_reduction = _heuristic("persistent_reduction")  # type: ignore[attr-defined]


@triton.jit
def _maximum(a, b):  # type: ignore[no-untyped-def]
    return tl.where(a > b, a, b)


@triton.jit
def _max2(a, dim):  # type: ignore[no-untyped-def]
    return tl.max(a, dim)


# A module object, as in the sources: Triton resolves ``triton_helpers.maximum`` through it.
triton_helpers = types.ModuleType("triton_helpers")
triton_helpers.maximum = _maximum  # type: ignore[attr-defined]
triton_helpers.max2 = _max2  # type: ignore[attr-defined]
