"""Where a captured graph reads its inputs: storage spans, static-input addresses and placeholders.

Problem: a CUDA graph replays fixed addresses. Inputs that change from call to call ("dynamic" inputs,
the user's tensors) must be read from addresses known at capture: placeholders the runner copies into
(what PyTorch2-CG does), or, with parameter indirection, slots that PI points at the real inputs.
Parameters and buffers ("static" inputs) are used in place and must not move.

Design: ``StorageSpan`` is where a tensor's data sits; ``static_pointers`` and ``storage_spans`` record
where a capture found the static inputs (checked on every replay, and the base of grace.rebind's
moves). ``placeholders_for`` makes the placeholders of a capture, or checks shared ones; ``dense_view``
narrows broadcast dimensions so that a placeholder can be copied into.

Invariants:
- placeholders live in the default pool, never in a graph's private pool, so they can be shared: the
  deciding call captures the graph-with-copies and the PI graph against one set of placeholders. Two
  graphs sharing placeholders run one after the other on one stream (each replay copies what it reads
  into them first), and a released graph drops only its references to them;
- a shared placeholder has exactly its input's size, strides, dtype and device.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grace.compat import torch as torch_compat


@dataclass(frozen=True)
class StorageSpan:
    """Where a tensor's data sits: its data pointer and its storage's address range."""

    data_ptr: int
    start: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.start + self.nbytes

    @classmethod
    def of(cls, t: torch.Tensor) -> StorageSpan:
        storage = t.untyped_storage()
        return cls(int(t.data_ptr()), int(storage.data_ptr()), int(storage.nbytes()))


def static_pointers(args: Sequence[Any], static_indices: Sequence[int]) -> list[int | None]:
    """``data_ptr()`` of each static input by position (None elsewhere): where a graph reads them."""
    pointers: list[int | None] = [None] * len(args)
    for i in static_indices:
        pointers[i] = args[i].data_ptr()
    return pointers


def storage_spans(args: Sequence[Any], indices: Sequence[int]) -> dict[int, StorageSpan]:
    return {i: StorageSpan.of(args[i]) for i in indices if isinstance(args[i], torch.Tensor)}


def dense_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` narrowed to length 1 along broadcast (stride 0) dimensions, so it can be copied into."""
    if all(s != 0 or n <= 1 for s, n in zip(t.stride(), t.shape, strict=True)):
        return t
    index = tuple(
        slice(0, 1) if s == 0 and n > 1 else slice(None) for s, n in zip(t.stride(), t.shape, strict=True)
    )
    return t[index]


def make_placeholder(t: torch.Tensor) -> torch.Tensor:
    """A fresh tensor with ``t``'s size, strides and dtype on ``t``'s device (storage offset 0)."""
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)


def placeholders_for(
    args: Sequence[Any], dynamic_indices: Sequence[int], shared: Mapping[int, torch.Tensor] | None = None
) -> dict[int, torch.Tensor]:
    """The placeholders a capture of ``args`` reads its dynamic inputs from: fresh ones, or ``shared``.

    ``shared`` (the placeholders of another graph of the same call) must hold exactly the dynamic
    indices, each with its input's size, strides, dtype and device: a graph captured against a
    placeholder of another layout would read the copied input wrongly. Raises ``ValueError`` otherwise.
    """
    if shared is None:
        return {i: make_placeholder(args[i]) for i in dynamic_indices}
    if set(shared) != set(dynamic_indices):
        raise ValueError(
            f"shared placeholders cover inputs {sorted(shared)}, the capture needs {sorted(dynamic_indices)}"
        )
    for i in dynamic_indices:
        p, t = shared[i], args[i]
        if (p.size(), p.stride(), p.dtype, p.device) != (t.size(), t.stride(), t.dtype, t.device):
            raise ValueError(
                f"shared placeholder {i} is {tuple(p.shape)}/{p.stride()}/{p.dtype}/{p.device}, "
                f"input {i} is {tuple(t.shape)}/{t.stride()}/{t.dtype}/{t.device}"
            )
    return {i: shared[i] for i in dynamic_indices}


def poison_placeholders(placeholders: Mapping[int, torch.Tensor]) -> None:
    """Fill the placeholders with zeros.

    A graph reads a placeholder only after the runner copied the input into it, so this never changes
    a correct result; a graph that reads a placeholder it should not (a PI slot left at its capture
    address) then computes with zeros instead of the last copied values, and fails its numeric check
    unless its output does not depend on that input. Zeros, not NaN: a broken graph that turns the value
    into an index or a size must stay in bounds (a fault would end the process, not just the variant);
    the first call at other addresses is verified against eager again (grace.verify).
    """
    for p in placeholders.values():
        dense_view(p).zero_()


Layout = tuple[torch.Size, tuple[int, ...], torch.dtype]  # size, strides, dtype of a placeholder


def _layout(t: torch.Tensor) -> Layout:
    return (t.size(), tuple(t.stride()), t.dtype)


@dataclass
class Bindings:
    """Where one graph reads its inputs: its placeholders and the static inputs' capture addresses.

    ``copy_indices``: the dynamic inputs read through a placeholder (copied into it, unless PI points
    the graph elsewhere); ``mutated_indices``: those of them the graph writes (copied back after a
    replay). A ``borrowed`` graph was captured on the caller's inputs: of those it read in place it
    keeps only their ``layouts``, and gets placeholders for them when a call first needs one
    (``own_placeholders``); ``placeholders`` holds the rest. Every dynamic input is in exactly one of
    ``placeholders`` and ``layouts``."""

    placeholders: dict[int, torch.Tensor]
    copy_indices: tuple[int, ...]
    mutated_indices: tuple[int, ...]
    static_indices: tuple[int, ...]
    static_ptrs: list[int | None]
    copy_bytes: int = 0
    layouts: dict[int, Layout] = field(default_factory=dict)
    dense: dict[int, torch.Tensor] = field(default_factory=dict)  # dense_view of each placeholder

    @property
    def borrowed(self) -> bool:
        """Whether some dynamic input has no placeholder (the graph was captured reading it in place)."""
        return bool(self.layouts)

    @classmethod
    def of(
        cls,
        placeholders: Mapping[int, torch.Tensor],
        *,
        copy_indices: tuple[int, ...],
        mutated_indices: tuple[int, ...],
        static_indices: tuple[int, ...],
        static_ptrs: list[int | None],
        copy_bytes: int = 0,
        borrowed: bool = False,
        own_indices: frozenset[int] = frozenset(),
        layouts: Mapping[int, Layout] | None = None,
    ) -> Bindings:
        """Bindings over ``placeholders``. ``borrowed``: those not in ``own_indices`` are the caller's
        inputs, of which only the layouts are kept; ``layouts``: inputs with none at all (a rebound
        graph takes its origin's)."""
        kept = {i: p for i, p in placeholders.items() if not borrowed or i in own_indices}
        found = {i: _layout(p) for i, p in placeholders.items() if i not in kept}
        found.update(layouts or {})
        return cls(
            placeholders=kept,
            copy_indices=copy_indices,
            mutated_indices=mutated_indices,
            static_indices=static_indices,
            static_ptrs=static_ptrs,
            copy_bytes=copy_bytes,
            layouts=found,
            dense={i: dense_view(p) for i, p in kept.items()},
        )

    def own_placeholders(self, device: torch.device) -> dict[int, int]:
        """Give a borrowed graph placeholders of its own for the inputs it read in place; returns their
        addresses.

        Only a graph whose every read of such an input goes through PI's table may lack them (nothing
        in it reads a captured address), so the new ones serve every later copy."""
        made = {
            i: torch.empty_strided(size, stride, dtype=dtype, device=device)
            for i, (size, stride, dtype) in self.layouts.items()
        }
        self.placeholders.update(made)
        self.dense.update({i: dense_view(p) for i, p in made.items()})
        self.layouts = {}
        return {i: int(p.data_ptr()) for i, p in made.items()}

    def forget_placeholders(self, keep: Collection[int] = ()) -> None:
        """Drop the placeholders but those of ``keep`` and keep their layouts, as a graph captured on the
        caller's inputs does (it gets new ones from ``own_placeholders`` when a call first needs one).
        Only for inputs the graph reads through PI's table alone (Note: [Placeholders PI serves] in
        grace.variants)."""
        dropped = [i for i in self.placeholders if i not in keep]
        for i in dropped:
            self.layouts[i] = _layout(self.placeholders.pop(i))
            del self.dense[i]

    def lacks_placeholder(self, indices: Sequence[int]) -> bool:
        """Whether one of ``indices`` has no placeholder now (a call must give the graph its own first)."""
        return bool(self.layouts) and not self.layouts.keys().isdisjoint(indices)

    def copy_in(self, args: Sequence[Any], indices: Sequence[int]) -> None:
        dense = self.dense
        torch_compat.foreach_copy([dense[i] for i in indices], [self._dense_input(args, i) for i in indices])

    def copy_back(self, args: Sequence[Any], indices: Sequence[int]) -> None:
        for i in indices:
            self._dense_input(args, i).copy_(self.dense[i])

    def _dense_input(self, args: Sequence[Any], i: int) -> torch.Tensor:
        """``dense_view(args[i])``, without looking at its strides when the placeholder needed no
        narrowing: a graph serves only inputs with its signature, so the input's strides are the
        placeholder's."""
        if self.dense[i] is self.placeholders[i]:
            return args[i]  # type: ignore[no-any-return]
        return dense_view(args[i])

    def drop(self) -> None:
        """Drop the references to the placeholders (shared ones stay with their other graphs)."""
        self.placeholders = {}
        self.dense = {}
