"""Parameter indirection (PI): replays read moved inputs through a device pointer table, not copies.

``prepare(ctx)`` is the seam the graph runner calls between capture and instantiation (Note: [PI seam]
in grace.capture), loaded by name through ``grace.seams``; it returns a plan satisfying
``grace.pi_contract.PIPlan`` (``grace.pi.plan.PiPlan``) or a ``SkipReason``. The pieces: ``stages``
(``prepare``, one function per stage), ``plan`` (the plan used per replay), ``ptx`` (the PTX rewrite),
``triton`` (Triton kernels of a graph), ``vendor`` (device-side updates of kernels that cannot be
rewritten), ``scan`` (where a graph uses its inputs), ``table`` and ``fill`` (the pointer table and its
writers), ``nvrtc`` (runtime compilation of grace's own kernels), ``driver`` (PI's driver operations),
``sass`` (checks on assembled kernels). Importing this package is cheap: it imports neither torch nor
Triton nor cuda-bindings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grace.pi_contract import PIContext, PIPlan
    from grace.reasons import SkipReason


def prepare(ctx: PIContext) -> PIPlan | SkipReason:
    """Prepare parameter indirection for the graph of ``ctx`` (a ``grace.capture.CaptureContext``)."""
    from grace.pi.stages import prepare as _prepare

    return _prepare(ctx)


__all__ = ["prepare"]
