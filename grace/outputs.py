"""A captured graph's outputs: which live in its pool, whether they are still held, and by whom.

Problem: a graph's outputs live in its private memory pool and every replay writes them again. A replay
must never overwrite outputs something still reads (within one compiled call, or in another thread),
and a pool must outlive every output of it a caller holds (grace.pools).

Design: the outputs in the pool are told apart from views of inputs (``OutputAlias``, ``pool_positions``);
``output_refs`` keeps weak references to their storages with the use counts the graph's own tensors give
them, so that a count above those means someone holds an output. ``HeldState`` is what a replay would
meet (Note: [Outputs held within one call], Note: [Outputs and threads]).

Note: [Outputs held within one call]
A graph's outputs live in its pool and its next replay writes them again. Across calls of a compiled
model that is the documented contract (as with cudagraph trees): clone what you keep, or set
``clone_outputs``. Within one call it is not something a user can see or avoid: Dynamo runs one compiled
piece (the code after a graph break in a layer, a helper function) once per layer, and a model that keeps
every layer's result (attention maps, hidden states) would find all of them equal to the last. So the
runner tells calls apart as cudagraph trees do (``grace.compat.torch.compiled_call_generation``: Dynamo's
count of top-level calls, or the user's ``cudagraph_mark_step_begin``) and never replays a graph a second
time in one call while an output of its previous replay is held: that call runs without the graph. The
first time a graph comes back within one call, the outputs it handed out were its own tensors, whose
holders cannot be counted, so it does not replay again in that call; from the next call on it hands out
aliases of its outputs, and a replay within the same call is allowed when the storages' use counts are
back to what the graph's own tensors give them (every alias and every view made of one has died). Graphs
rebound from one capture (grace.rebind) write the same outputs and count as one graph here: the state
lives with the captured graph (``CapturedGraph.outputs_owner``), with which graph replayed last
(``last_replayed_by_another``), so that the runner can tell a layer that holds another layer's outputs
(Note: [Layers that hold each other's outputs] in grace.rebind).

Note: [Outputs and threads]
Dynamo's count of top-level calls is shared by all threads: a call from another thread in between looks
like a new call of this thread, so Note: [Outputs held within one call] cannot tell one thread's calls
apart once grace serves several threads, and a thread cannot know when another thread's call
overwrites the outputs it received. So the first time a graph (or its family) is about to replay for a
thread other than the one its last replay served, or once the runners have been called from more than
one thread at all (``calling_threads``, noted by the runner on every call and forgotten by
``grace.reset()``), it stops handing out its own tensors: it replaces them by fresh
tensors over the same storages (``CapturedGraph.share_across_threads``), so that whatever was handed out
before counts in the storages' use counts, and hands out aliases from then on. From then on a replay
happens only when no output of the previous replay is held, by any thread (``held_outputs`` returns
``HeldState.HELD`` otherwise and the runner runs that call without the graph). With ``clone_outputs=True`` no
output of the pool is handed out and the rule never applies.

Note: [Outputs autograd keeps]
The graphs of a training step are AOTAutograd's forward and backward (grace.training). A forward's
outputs from position ``kept_from`` on are the tensors it saves for its backward, and every output of a
backward is a gradient that may become a parameter's ``.grad``: autograd keeps them past the compiled
call, so the per-call contract above cannot cover them. Such a family (``OutputFamily.for_autograd``)
hands out aliases from its first replay (autograd also sets ``grad_fn`` on what a forward returns, which
must never be the graph's own tensor), and a replay happens only while no storage of a kept output is
held by anything but the graph: a forward whose saved tensors a pending backward still needs, or a
backward whose gradients are still a ``.grad`` (accumulation without ``zero_grad(set_to_none=True)``),
runs that call without the graph. A forward's outputs before ``kept_from`` go to the caller and follow
the per-call contract.

Note: [Outputs a shared pool lends]
A graph that keeps its outputs keeps their memory allocated for as long as it lives; in a pool shared by a
training step's graphs (grace.poolgroups) that is what keeps a backward from taking the memory of saved
tensors its forward no longer needs, as eager and cudagraph trees do. So a training graph in a shared
pool, once its deciding call has handed out its outputs, gives up owning them
(``OutputFamily.lend``): its own tensors become tensors over the same addresses whose storages own
nothing (``allocator.unowned_like``), and the storages it had owned live only as long as what was
handed out from them; when they die the allocator counts their blocks as free, and a later capture into
the pool may take them. Replays hand out aliases of the unowned tensors, which the allocator does not
count. That is safe because nothing but a capture into the pool allocates from it: a capture into the
pool is allowed only while no output of any member lies in such a free block and is still held
(``OutputFamily.unbacked_held``, checked by ``poolgroups.for_capture``); else that capture gets a pool
of its own. Replays stay ordered by footprints (Note: [What a replay can overwrite] in
grace.poolgroups), which now also meet outputs of members captured earlier. The held checks count both
storages of a lent output: the unowned one beyond the graph's own tensors and the one it had owned.
A deciding call lends every set of its slot that has not lent yet: where its replay was refused (Note:
[One new set per call] in grace.outputsets), the new set's outputs were never handed out, and unlent
they would stay allocated for as long as the set lives.

Invariant: nothing here holds an output beyond the graph's own list; weak references only.
"""

from __future__ import annotations

import enum
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grace.compat import allocator
from grace.compat import torch as torch_compat
from grace.streams import calling_threads


class HeldState(enum.Enum):
    """Whether a replay now could overwrite outputs of the last replay that something still holds (Note:
    [Outputs held within one call])."""

    NONE = "none"  # a replay overwrites nothing still held
    UNKNOWN = "unknown"  # the last replay in this call handed out the outputs themselves: not countable
    HELD = "held"  # counted: an alias or a view of an output is alive


@dataclass(frozen=True)
class OutputAlias:
    """Output ``position`` is a view of dynamic input ``input_index``'s storage."""

    position: int
    input_index: int
    offset_delta: int  # output storage offset minus the placeholder's storage offset


def _storage_ptr(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


def _in_pool(value: Any, device: torch.device) -> bool:
    """An output tensor the graph wrote on its device (graph outputs on other devices are refused)."""
    return isinstance(value, torch.Tensor) and value.device == device


def _pool_outputs_all(
    outputs: list[Any], aliases: Sequence[OutputAlias], device: torch.device
) -> dict[int, torch.Tensor]:
    """Position -> output tensor, for every output in the graph's pool (views of inputs left out)."""
    viewing_inputs = {a.position for a in aliases}
    return {
        position: out
        for position, out in enumerate(outputs)
        if position not in viewing_inputs and _in_pool(out, device)
    }


def _pool_outputs(
    outputs: list[Any], aliases: Sequence[OutputAlias], device: torch.device
) -> dict[int, torch.Tensor]:
    """One output tensor per storage the graph's pool holds for its outputs (views of inputs left out)."""
    found: dict[int, torch.Tensor] = {}
    for out in _pool_outputs_all(outputs, aliases, device).values():
        found.setdefault(_storage_ptr(out), out)
    return found


def output_refs(
    outputs: list[Any], aliases: Sequence[OutputAlias], device: torch.device
) -> list[tuple[Any, int]]:
    """(weak reference, use count) per storage of the outputs that live in the graph's pool, the counts
    taken while only the graph's own tensors hold them."""
    refs = [torch_compat.storage_weak_ref(t) for t in _pool_outputs(outputs, aliases, device).values()]
    return [(ref, torch_compat.storage_use_count(ref)) for ref in refs]


def kept_storages(
    outputs: list[Any], aliases: Sequence[OutputAlias], device: torch.device, kept_from: int
) -> tuple[bool, ...]:
    """Per storage of ``output_refs`` (same order): whether an output at position ``kept_from`` or later
    lies in it (Note: [Outputs autograd keeps])."""
    kept = {_storage_ptr(t) for p, t in _pool_outputs_all(outputs, aliases, device).items() if p >= kept_from}
    return tuple(key in kept for key in _pool_outputs(outputs, aliases, device))


def pool_storage_spans(
    outputs: list[Any], aliases: Sequence[OutputAlias], device: torch.device, positions: frozenset[int] | None
) -> tuple[tuple[int, int], ...]:
    """Per storage of ``output_refs`` (same order): its address range, or an empty one at its start where
    no output at ``positions`` (None: any) lies in it."""
    chosen = {
        _storage_ptr(t)
        for p, t in _pool_outputs_all(outputs, aliases, device).items()
        if positions is None or p in positions
    }
    return tuple(
        (key, key + (int(t.untyped_storage().nbytes()) if key in chosen else 0))
        for key, t in _pool_outputs(outputs, aliases, device).items()
    )


def data_in_spans(args: Sequence[Any], indices: Sequence[int], spans: Sequence[tuple[int, int]]) -> bool:
    """Whether the data of a tensor among ``args`` at ``indices`` starts in one of ``spans``."""
    for i in indices:
        a = args[i]
        if isinstance(a, torch.Tensor):
            ptr = a.data_ptr()
            if any(start <= ptr < end for start, end in spans):
                return True
    return False


def pool_positions(
    outputs: list[Any],
    aliases: Sequence[OutputAlias],
    device: torch.device,
    args: Sequence[Any],
    static_indices: Sequence[int],
) -> frozenset[int]:
    """Positions of the outputs the graph wrote in its pool: not views of a dynamic input (``aliases``)
    nor of a static input (a parameter or buffer returned as it is)."""
    static = {_storage_ptr(args[i]) for i in static_indices if isinstance(args[i], torch.Tensor)}
    return frozenset(
        position
        for position in _pool_outputs_all(outputs, aliases, device)
        if _storage_ptr(outputs[position]) not in static
    )


def pool_output_bytes(outputs: list[Any], aliases: Sequence[OutputAlias], device: torch.device) -> int:
    return sum(int(t.untyped_storage().nbytes()) for t in _pool_outputs(outputs, aliases, device).values())


@dataclass
class OutputFamily:
    """The state of one set of outputs in one pool: held outputs, stream order, the pool's lifetime.

    The graphs that write one set of outputs (a captured graph and those grace.rebind made from it)
    keep this state with the captured graph (``CapturedGraph.outputs_owner``). ``refs``: weak references
    to the outputs' storages in the pool, each with the use count the graph's own tensors give it (Note:
    [Outputs held within one call]); ``last_generation``: the compiled call of the last replay;
    ``aliases_since``: the call from which replays hand out aliases of the outputs (None: the outputs
    themselves); ``last_writer``: ``id()`` of the graph whose replay wrote them last; ``last_thread``,
    ``threads_shared``: Note: [Outputs and threads]; ``last_stream``, ``last_stream_key``: the stream of
    the last run (Note: [Stream order] in grace.streams); ``sharers``: graphs rebound from the captured
    one; ``release_pending``, ``released``: the pool waits for the last sharer, or is gone."""

    refs: list[tuple[Any, int]] = field(default_factory=list)
    last_generation: int | None = None
    aliases_since: int | None = None
    last_writer: int | None = None
    last_thread: int | None = None
    threads_shared: bool = False
    last_stream: Any = None
    last_stream_key: int | None = None
    sharers: int = 0
    release_pending: bool = False
    released: bool = False
    for_autograd: bool = False
    kept: tuple[bool, ...] = ()
    owners: tuple[Any, ...] = ()  # per ref: the storage it had owned (Note: [Outputs a shared pool lends])
    _held_checks: tuple[torch_compat.StoragesHeld, torch_compat.StoragesHeld] | None = field(
        default=None, repr=False
    )  # built from refs (_checks)

    @classmethod
    def of(
        cls,
        outputs: list[Any],
        aliases: Sequence[OutputAlias],
        device: torch.device,
        kept_from: int | None,
    ) -> OutputFamily:
        """The family of a captured graph's outputs; ``kept_from``: Note: [Outputs autograd keeps]."""
        refs = output_refs(outputs, aliases, device)
        if kept_from is None:
            return cls(refs=refs)
        return cls(refs=refs, for_autograd=True, kept=kept_storages(outputs, aliases, device, kept_from))

    def counted_held(self) -> bool:
        return self._checks()[0]()

    def held_beyond_graph(self) -> bool:
        """Whether anything but the graph holds an output: counted against the graph's own tensors while
        it lives, against none once it is released (it dropped them)."""
        if self.released:
            return any(torch_compat.storage_use_count(ref) > 0 for ref in self.all_refs())
        return self.counted_held()

    def all_refs(self, indices: Sequence[int] | None = None) -> list[Any]:
        """Weak references to every storage whose holders keep the outputs' memory in use: the outputs'
        own and, for lent ones, the storages they were handed out from; ``indices``: of those ``refs``
        alone."""
        if indices is None:
            return [ref for ref, _ in self.refs] + [owner for owner in self.owners if owner is not None]
        owners = [self.owners[i] for i in indices if i < len(self.owners)]
        return [self.refs[i][0] for i in indices] + [owner for owner in owners if owner is not None]

    def lend(
        self,
        outputs: list[Any],
        aliases: Sequence[OutputAlias],
        device: torch.device,
        positions: frozenset[int],
    ) -> bool:
        """Note: [Outputs a shared pool lends]: replace the graph's own output tensors at ``positions``
        (those in its pool) in ``outputs`` (in place: the list is the family's) by unowned ones over the
        same memory; True when it did.
        Outputs already shared across threads with counts that could not be matched stay owned."""
        before = _pool_outputs(outputs, aliases, device)
        if self.owners or len(before) != len(self.refs):
            return False
        found = _pool_outputs_all(outputs, aliases, device)
        chosen = [p for p in found if p in positions]
        for position, fresh in zip(chosen, allocator.unowned_like([found[p] for p in chosen]), strict=True):
            outputs[position] = fresh
        lent_keys = {_storage_ptr(outputs[p]) for p in chosen}
        refs: list[tuple[Any, int]] = []
        owners: list[Any] = []
        now = _pool_outputs(outputs, aliases, device)
        for (ref, own), (key, tensor) in zip(self.refs, now.items(), strict=True):
            if key in lent_keys:
                fresh_ref = torch_compat.storage_weak_ref(tensor)
                refs.append((fresh_ref, torch_compat.storage_use_count(fresh_ref)))
                owners.append(ref)
            else:
                refs.append((ref, own))
                owners.append(None)
        self.refs, self.owners, self._held_checks = refs, tuple(owners), None
        return bool(lent_keys)

    def unbacked_held(self) -> bool:
        """Whether an output lent from memory the allocator counts as free (the storage it was handed out
        from has died) is still held: a capture into the pool could take that memory now."""
        return any(
            owner is not None
            and torch_compat.storage_use_count(ref) > own
            and torch_compat.storage_use_count(owner) == 0
            for (ref, own), owner in zip(self.refs, self.owners, strict=False)
        )

    def kept_held(self) -> bool:
        """Whether something (autograd's saved tensors, a gradient) holds an output it keeps past the call."""
        return self._checks()[1]()

    def _checks(self) -> tuple[torch_compat.StoragesHeld, torch_compat.StoragesHeld]:
        """The held checks over every storage of ``refs`` and over the kept ones, built once per ``refs``."""
        checks = self._held_checks
        if checks is None:
            checks = self._held_checks = _held_checks(self.refs, self.owners, self.kept)
        return checks

    def part(self, indices: Sequence[int]) -> OutputPart:
        """The storages at ``indices`` of ``refs`` (Note: [What a replay can overwrite] in
        grace.poolgroups)."""
        return OutputPart(self, tuple(indices))

    @property
    def hands_out_aliases(self) -> bool:
        """Whether replays hand out aliases of the outputs rather than the graph's own tensors."""
        return self.for_autograd or self.aliases_since is not None

    def needs_sharing(self) -> bool:
        """Whether the outputs are about to serve a second thread (Note: [Outputs and threads])."""
        return not self.threads_shared and (
            calling_threads.several or self.last_thread not in (None, threading.get_ident())
        )

    def held(self, generation: int) -> HeldState:
        """What a replay now, in compiled call ``generation``, would meet (after ``needs_sharing``)."""
        if self.threads_shared:  # Note: [Outputs and threads]
            return HeldState.HELD if self.counted_held() else HeldState.NONE
        if self.kept and self.kept_held():  # Note: [Outputs autograd keeps]
            return HeldState.HELD
        if generation != self.last_generation:
            return HeldState.NONE
        if self.for_autograd:  # aliases from the first replay: the holders are counted
            return HeldState.HELD if self.counted_held() else HeldState.NONE
        if self.aliases_since is None:
            self.aliases_since = generation
            return HeldState.UNKNOWN
        if generation == self.aliases_since:
            return HeldState.UNKNOWN
        return HeldState.HELD if self.counted_held() else HeldState.NONE

    def note_replay(self, generation: int, writer: int) -> None:
        self.last_generation = generation
        self.last_writer = writer
        self.last_thread = threading.get_ident()

    def share(self, outputs: list[Any], aliases: Sequence[OutputAlias], device: torch.device) -> None:
        """Note: [Outputs and threads]: replace the own output tensors by fresh ones over the same storages
        (whoever holds the old ones now counts as a holder) and hand out aliases from now on.

        The graphs of a family share one list of outputs (grace.rebind), replaced in place. Each storage's
        own count becomes what it was at capture less the old tensors (with the bases of views) the graph
        held on it, plus the fresh ones; where that cannot be matched it becomes 0 (always held).
        """
        self.threads_shared = True
        if self.aliases_since is None:
            self.aliases_since = self.last_generation if self.last_generation is not None else 0
        old = _pool_outputs_all(outputs, aliases, device)
        keys = list(_pool_outputs(outputs, aliases, device))
        old_impls: Counter[int] = Counter()
        seen: set[int] = set()
        for tensor in old.values():
            for impl in (tensor, tensor._base):
                if impl is not None and id(impl) not in seen:
                    seen.add(id(impl))
                    old_impls[_storage_ptr(impl)] += 1
        fresh: dict[int, torch.Tensor] = {}
        for position, tensor in old.items():
            new = fresh.get(id(tensor))
            if new is None:
                new = fresh[id(tensor)] = tensor.detach()  # a new tensor of the storage, no view of the old
            outputs[position] = new
        new_impls = Counter(_storage_ptr(t) for t in fresh.values())
        self._held_checks = None  # the counts below replace the refs'
        if len(keys) == len(self.refs):
            self.refs = [
                (ref, own - old_impls[key] + new_impls[key])
                for (ref, own), key in zip(self.refs, keys, strict=True)
            ]
        else:
            self.refs = [(ref, 0) for ref, _ in self.refs]


def _held_checks(
    refs: Sequence[tuple[Any, int]], owners: Sequence[Any], kept: Sequence[bool]
) -> tuple[torch_compat.StoragesHeld, torch_compat.StoragesHeld]:
    """Whether any of ``refs`` is held, and any of the kept ones (``kept``, per ref): a lent output (its
    ``owners`` entry not None) is held too while a tensor of the storage it was handed out from lives."""
    lent = [(owner, 0) for owner in owners if owner is not None]
    kept_pairs = [pair for pair, keeps in zip(refs, kept, strict=False) if keeps]
    kept_pairs += [
        (owner, 0) for owner, keeps in zip(owners, kept, strict=False) if keeps and owner is not None
    ]
    return torch_compat.StoragesHeld([*refs, *lent]), torch_compat.StoragesHeld(kept_pairs)


@dataclass(eq=False)
class OutputPart:
    """Some storages of an ``OutputFamily`` (``indices`` in its ``refs``): the family's held questions
    asked of those alone, for a replay whose footprint meets only them (Note: [What a replay can
    overwrite] in grace.poolgroups). The checks are rebuilt whenever the family's ``refs`` are replaced
    (lent, shared across threads); an index past them makes every question the whole family's."""

    family: OutputFamily
    indices: tuple[int, ...]
    _for_refs: Any = field(default=None, repr=False)
    _checks: tuple[torch_compat.StoragesHeld, torch_compat.StoragesHeld] | None = field(
        default=None, repr=False
    )

    def counted_held(self) -> bool:
        return self._current()[0]()

    def kept_held(self) -> bool:
        return self._current()[1]()

    def held_beyond_graph(self) -> bool:
        """``OutputFamily.held_beyond_graph`` over these storages."""
        family = self.family
        if not family.released:
            return self.counted_held()
        if any(i >= len(family.refs) for i in self.indices):
            return family.held_beyond_graph()
        return any(torch_compat.storage_use_count(ref) > 0 for ref in family.all_refs(self.indices))

    def _current(self) -> tuple[torch_compat.StoragesHeld, torch_compat.StoragesHeld]:
        family = self.family
        if any(i >= len(family.refs) for i in self.indices):
            return family._checks()
        if self._checks is None or self._for_refs is not family.refs:
            refs = [family.refs[i] for i in self.indices]
            owners = [family.owners[i] if i < len(family.owners) else None for i in self.indices]
            kept = [i < len(family.kept) and family.kept[i] for i in self.indices]
            self._checks, self._for_refs = _held_checks(refs, owners, kept), family.refs
        return self._checks
