"""Where every extra run of one call starts: the inputs it writes and the generators, as the call found them.

Problem: grace runs a call more than once while it decides on a graph and while it verifies one (the
no-graph reference, the numeric checks of each variant, a replay at new input addresses, the verified
replays of later calls). A callable that writes its inputs would apply its side effects once per run,
and one that draws random numbers would consume the generator once per run: the caller would see
neither what eager nor what Inductor gives for the same call.

Design: ``CallStart`` is taken before the first run of a call: a copy of each input the callable writes
(``grace.hostref.kept_inputs``; in host memory when large) and, for a callable with random ops, the
default generators' states (``grace.compat.generators``). ``restore`` puts both back before every extra
run, so each run starts from the caller's state; ``note_first_run`` and ``resume_first_run`` let a call
that returns its first run's output leave the generators where that one run left them.
``unexpected_writes`` tells after the first run whether it wrote an input the analysis did not list:
``counted``, by the input's version counter (an eager op's write: the deciding call stops there, that
run being the call, and decides again on the next call with that input among the written ones), and
``unseen``, for a ``CallStart`` taken with ``fingerprints`` (the deciding call's), by a sum over the
input's bytes taken before the run where no counter moved: a kernel wrote memory no op declares (an
Inductor backward writing a saved tensor's memory; a write to an inference tensor the analysis
missed). grace cannot tell what else such code writes, so that slot keeps no graph.

Invariant (the rule for every graph that writes an input or draws random numbers): a call's effects on
the caller's state are those of exactly one run. Every run grace makes beyond the caller's one starts
from a ``CallStart.restore``, and the run whose output the caller gets is the last one, or the
generators are put back where it left them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grace.compat import generators as generators_compat
from grace.hostref import kept_inputs, restore_inputs


@dataclass(frozen=True)
class UnlistedWrites:
    """Inputs a run wrote that the callable's written inputs do not list (``CallStart.unexpected_writes``):
    ``counted`` by their version counters, ``unseen`` by their contents alone."""

    counted: tuple[int, ...] = ()
    unseen: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.counted or self.unseen)


class CallStart:
    """The state an extra run of one call must start from (see the module docstring)."""

    def __init__(
        self,
        args: Sequence[Any],
        mutated: Sequence[int],
        random: bool,
        device: torch.device | None,
        host_bytes: int = 0,
        fingerprints: bool = False,
    ) -> None:
        self._args = args
        self._mutated = frozenset(mutated)
        self._versions = input_versions(args)
        self._sums = content_sums(args, self._mutated) if fingerprints else None
        self._inputs = kept_inputs(args, list(mutated), host_bytes)
        # Raises where the generators' state cannot be read: the caller declines the graph then.
        self._generators = generators_compat.save_generators(device) if random else None
        self._device = device
        self._after_first: generators_compat.GeneratorStates | None = None

    @property
    def random(self) -> bool:
        return self._generators is not None

    def restore(self) -> None:
        """Put the written inputs and the generators back as the call found them."""
        restore_inputs(self._args, self._inputs)
        if self._generators is not None:
            generators_compat.restore_generators(self._generators)

    def unexpected_writes(self) -> UnlistedWrites:
        """Inputs whose version counters or (with ``fingerprints``) contents changed since the call
        started although they are not among the inputs the callable writes: writes the analysis did not
        see."""
        now = input_versions(self._args)
        counted = tuple(
            i
            for i, (before, after) in enumerate(zip(self._versions, now, strict=True))
            if before is not None and after is not None and before != after and i not in self._mutated
        )
        changed = changed_contents(self._args, self._sums) if self._sums is not None else []
        written = _storages(self._args, self._mutated)  # a listed write changes every view of its memory
        unseen = (i for i in changed if i not in counted and _storage(self._args[i]) not in written)
        return UnlistedWrites(counted, tuple(unseen))

    def note_first_run(self) -> None:
        """Remember where the generators stand after the run whose output the caller may get."""
        if self._generators is not None:
            self._after_first = generators_compat.save_generators(self._device)

    def resume_first_run(self) -> None:
        """Leave the generators where the noted run left them (nothing to do without random ops)."""
        if self._after_first is not None:
            generators_compat.restore_generators(self._after_first)


def input_versions(args: Sequence[Any]) -> list[int | None]:
    """Each input's version counter (None for a non-tensor or an inference tensor)."""
    out: list[int | None] = []
    for value in args:
        version = None
        if isinstance(value, torch.Tensor):
            try:
                version = int(value._version)
            except RuntimeError:  # an inference tensor tracks no version
                version = None
        out.append(version)
    return out


_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}  # by size in bytes


def content_sums(args: Sequence[Any], skip: frozenset[int]) -> list[torch.Tensor | None]:
    """Per input (None for a non-tensor, one in ``skip`` or one whose bytes cannot be read), the sum of
    its contents read as integer words, wrapping around, on its device: taken without a synchronisation
    and without a copy of the input, compared by ``changed_contents``. A contiguous input is read as
    the widest words its size and address allow (64-bit for most); a strided one element by element,
    as integers of the element's size. A write that changes a value changes the sum unless other writes
    make up for it exactly (modulo the word's range); a write of the same values is no write."""
    return [None if i in skip else _content_sum(value) for i, value in enumerate(args)]


def _content_sum(value: Any) -> torch.Tensor | None:
    if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.is_meta or value.numel() == 0:
        return None
    try:
        with torch.no_grad():
            words = _as_words(value.detach())
            # The words' own dtype: a sum into a wider one would first copy the input into it.
            return None if words is None else words.sum(dtype=words.dtype)
    except RuntimeError:  # a layout whose bytes cannot be viewed (sparse, quantized): no fingerprint
        return None


def _as_words(tensor: torch.Tensor) -> torch.Tensor | None:
    """``tensor``'s bytes as integer words, a view (no copy); None for an element size with no word."""
    if not tensor.is_contiguous():
        word = _WORDS.get(tensor.element_size())
        return None if word is None else tensor.view(word)  # same size: any strides
    raw = tensor.reshape(-1).view(torch.uint8)
    size = next(s for s in _WORDS if raw.numel() % s == 0 and raw.data_ptr() % s == 0)
    return raw.view(_WORDS[size])


def changed_contents(args: Sequence[Any], sums: Sequence[torch.Tensor | None]) -> list[int]:
    """The inputs whose contents no longer give the sum ``content_sums`` took (one synchronisation
    per device)."""
    by_device: dict[torch.device, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
    for i, (value, before) in enumerate(zip(args, sums, strict=True)):
        after = None if before is None else _content_sum(value)
        if before is not None and after is not None:
            by_device.setdefault(before.device, []).append((i, before, after))
    changed = []
    for pairs in by_device.values():
        differ = (torch.stack([b for _, b, _ in pairs]) != torch.stack([a for _, _, a in pairs])).tolist()
        changed += [i for (i, _, _), d in zip(pairs, differ, strict=True) if d]
    return sorted(changed)


def _storage(value: Any) -> int | None:
    return value.untyped_storage().data_ptr() if isinstance(value, torch.Tensor) else None


def _storages(args: Sequence[Any], indices: frozenset[int]) -> set[int | None]:
    return {_storage(args[i]) for i in indices} - {None}
