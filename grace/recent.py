"""The runner's fast path to the slot of its last call: a check that a call has that slot's signature.

Problem: building a call's signature (shapes, strides, dtypes of the dynamic inputs, values of the
integer inputs) and looking it up costs host time on every call, and most calls repeat the last one's
signature.

Design: ``RecentSlot`` keeps the last call's slot with torch's C++ tensor check over the dynamic inputs
(``grace.compat.torch.tensor_metadata_check``) and the scalar inputs' types and values; the runner
builds one per slot, once, and tries it first.

Invariant: a match always means the same signature (the tensor check also compares device, dispatch
keys and requires_grad); a mismatch only sends the call down the full path. Nothing here knows what a
slot is: it is the runner's (grace.slot.GraphSlot).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from grace.compat import torch as torch_compat
from grace.picking import Picker, picker
from grace.runplan import RunnerPlan

SlotT = TypeVar("SlotT")


class RecentSlot(Generic[SlotT]):
    """The slot of the last call, with a check that this call has its signature without rebuilding it.

    The tensor check (``torch_compat.tensor_metadata_check``) is stricter than the signature (it also
    compares device, dispatch keys and requires_grad), so a match always means the same signature and a
    mismatch only sends the call down the full path. Scalars are compared with their types, as in the
    signature."""

    __slots__ = ("_check", "_scalar_values", "_scalars", "_tensors", "slot")

    def __init__(
        self,
        slot: SlotT,
        check: Callable[..., bool],
        tensors: Picker,
        scalars: Picker,
        scalar_values: tuple[tuple[type, Any], ...],
    ) -> None:
        self.slot = slot
        self._check = check
        self._tensors = tensors
        self._scalars = scalars
        self._scalar_values = scalar_values

    @classmethod
    def build(cls, plan: RunnerPlan, args: Sequence[Any], slot: SlotT) -> RecentSlot[SlotT] | None:
        tensors = picker(plan.dynamic_indices)
        check = torch_compat.tensor_metadata_check(tensors(args))
        if check is None:
            return None
        scalars = picker(plan.scalar_indices)
        return cls(slot, check, tensors, scalars, tuple((type(v), v) for v in scalars(args)))

    def matches(self, args: Sequence[Any]) -> bool:
        if self._scalar_values and tuple((type(v), v) for v in self._scalars(args)) != self._scalar_values:
            return False
        return bool(self._check(*self._tensors(args)))
