"""Parameter indirection (PI): replays read moved inputs through a device pointer table, not copies.

``prepare(ctx)`` is the seam the graph runner calls between capture and instantiation (Note: [PI seam]
in grace.capture); it returns a plan (``grace.pi.plan.PiPlan``) or a ``SkipReason``. The pieces:
``ptx`` (the PTX rewrite), ``triton`` (Triton kernels of a graph), ``vendor`` (device-side updates of
kernels that cannot be rewritten), ``scan`` (where a graph uses its inputs), ``table`` (the pointer
table), ``driver`` (driver calls), ``sass`` (checks on assembled kernels). Importing this package is
cheap: it imports neither torch nor Triton nor cuda-bindings.
"""

from __future__ import annotations

from typing import Any


def prepare(ctx: Any) -> Any:
    """Prepare parameter indirection for the graph of ``ctx`` (a ``grace.capture.CaptureContext``)."""
    from grace.pi.stages import prepare as _prepare

    return _prepare(ctx)


__all__ = ["prepare"]
