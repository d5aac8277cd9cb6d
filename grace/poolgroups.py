"""Graphs captured into one memory pool, and which of them a replay can overwrite.

Problem: a pool per captured graph wastes memory (each pool keeps its own slack, and a backward cannot
use the memory of a forward's temporaries), but graphs that share a pool may land on each other's
memory, and a replay must never overwrite an output something still needs.

Note: [Graphs in one pool] Graphs may be captured into one pool (``PoolGroup``): a training graph's
output sets (option ``output_sets_share_pool``, Note: [Output sets] in grace.outputsets), or every
training graph of a device (Note: [A training step in one pool]). A capture allocates only blocks free
at that moment: a member's temporaries, free blocks, and the outputs a member lent once what they were
handed out as has died (Note: [Outputs a shared pool lends] in grace.outputs; a member that keeps its
outputs keeps them allocated). So a replay, which writes everything its capture allocated, may
overwrite outputs of members captured after it, and lent outputs of members captured before it.
Note: [What a replay can overwrite] says which: ``PoolGroup.overwritten_held`` tells whether one of
their outputs is still needed (kept by autograd, held in this compiled call, read by this call, or held
at all where the member serves another callable: the per-call contract covers only a callable's own
outputs), and then the graph does not replay; the slot takes another set or makes one. So a slot's
sets are taken earliest first, as a stack (grace.outputsets). A group also keeps one stream order, as
one family does (Note: [Stream order] in grace.streams), so that no two members run at once.

Note: [What a replay can overwrite] A replay writes only memory its capture allocated (its outputs and
temporaries) or memory outside the pool. Where the allocator's history can be recorded around the capture
(``allocator.AllocationTrace``), those blocks are the footprint. Otherwise the capture reads the pool's
layout (segments and blocks in use) before and after: its replays can write only the pool's memory that
was not in use by others throughout, that is every segment after the capture less the blocks in use both
before and after, plus its own outputs (``capture_footprint``): every free block, which makes a replay
wait for nearly every member captured after it. Joining the group, a graph is noted as overwritten by each
member whose footprint meets its outputs, and as overwriting each member whose outputs its footprint
meets; a replay checks only those members, not the whole group, and of each only the output storages its
footprint meets (``OutputFamily.part``): a forward hands out a result its caller drops at once beside
tensors autograd keeps until the backward, and a later capture may take the result's memory; its replays
must wait for the result, never for the kept tensors, or they would be refused until the backward and the
slot would make a set per call. The first output set, captured alone before its group was made, takes the
whole pool as it is then (``PoolGroup.around``). Where the layout is unknown (no snapshot in this torch),
the footprint is taken to be everything: the graph overwrites every member captured after it.

Note: [A training step in one pool] (option ``step_pool``) Every graph a device's training step
captures (AOTAutograd's forwards and backwards, and their output sets) goes into one pool, as cudagraph
trees keep one pool per device: a backward's temporaries and gradients then take the memory of the
forwards' temporaries, and the slack of one segment list replaces that of a pool per graph. Needs the
pool layout (without it each graph keeps a pool of its own). A pool that no graph holds any more (its
only capture declined, or every member released) may be freed, and torch refuses captures into a freed
id: the next capture takes a fresh id (``PoolGroup.capture_handle``).

Invariants:
- a member's replay is allowed only while no output it may overwrite is still needed
  (``overwritten_held``), whichever member captured it and whichever callable it serves;
- a capture goes into the pool only while no lent output lies in a free block and is held
  (``for_capture``); members lend only where every footprint is known (``lend_outputs``);
- a footprint is a superset of what a replay writes in the pool; an unknown one is everything;
- the group holds no tensor: members are the captured graphs, which hold (or lend) their outputs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from grace.compat import allocator
from grace.compat.allocator import PoolLayout, Span
from grace.reasons import SkipCode, SkipReason

_lock = threading.Lock()  # members and seats of every group
_registry_lock = threading.Lock()  # the step groups


Spans = tuple[Span, ...]  # sorted, disjoint [start, end) ranges


def merged(spans: Iterable[Span]) -> Spans:
    """``spans`` sorted, with overlapping and touching ranges joined."""
    out: list[Span] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return tuple(out)


def intersection(a: Spans, b: Spans) -> Spans:
    out: list[Span] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def _difference(a: Spans, b: Spans) -> Spans:
    out: list[Span] = []
    for start, end in a:
        for cut_start, cut_end in b:
            if cut_end <= start or cut_start >= end:
                continue
            if cut_start > start:
                out.append((start, cut_start))
            start = max(start, cut_end)
            if start >= end:
                break
        if start < end:
            out.append((start, end))
    return tuple(out)


def overlap(a: Spans, b: Spans) -> bool:
    return bool(intersection(a, b))


def capture_footprint(
    before: PoolLayout | None,
    after: PoolLayout | None,
    outputs: Spans,
    allocated: Spans | None = None,
) -> Spans | None:
    """Note: [What a replay can overwrite]: the pool's memory a graph's replay may write: the blocks its
    capture ``allocated`` in the pool where they are known, else the pool's free memory from its layout
    before and after the capture; None when neither is known."""
    if after is not None and allocated is not None:
        return merged((*intersection(merged(allocated), merged(after.segments)), *outputs))
    if before is None or after is None:
        return None
    untouched = intersection(merged(before.allocated), merged(after.allocated))
    return merged((*_difference(merged(after.segments), untouched), *outputs))


@dataclass
class CaptureReading:
    """What one capture into a group's pool read (grace.capture): the pool's layout before and after it,
    and the blocks it allocated (None: not recorded, ``allocator.AllocationTrace``)."""

    before: PoolLayout | None = None
    after: PoolLayout | None = None
    allocated: Spans | None = None

    def footprint(self, outputs: Spans) -> Spans | None:
        return capture_footprint(self.before, self.after, outputs, self.allocated)


def whole_pool(layout: PoolLayout | None) -> Spans | None:
    """Every segment of a pool (the footprint of its only graph so far), or None when unknown."""
    return merged(layout.segments) if layout is not None else None


@dataclass(eq=False)
class Seat:
    """A member of a pool group: its graph, which callable it serves (``kin``), its footprint (None:
    unknown, taken as every later member's memory), its outputs and, where known, each output storage's
    span (``storages``, in its family's order), the members its replay may overwrite an output of, and
    where it was captured among the group's members (``order``, increasing). Read, never written,
    outside this module (``PoolGroup.seats``: diagnostics)."""

    graph: Any
    kin: object
    footprint: Spans | None
    outputs: Spans
    storages: tuple[Span, ...] = ()
    order: int = 0
    overwrites: list[Overwrite] = field(default_factory=list)


class _HeldPart(Protocol):
    """Some storages of a member's outputs (``OutputFamily.part``), asked what the family is asked."""

    def kept_held(self) -> bool: ...
    def counted_held(self) -> bool: ...
    def held_beyond_graph(self) -> bool: ...


@dataclass(eq=False)
class Overwrite:
    """A member (``seat``) a replay may overwrite outputs of, and which: ``part``, the storages of its
    family the replay's footprint meets, or None for every one."""

    seat: Seat
    part: _HeldPart | None = None


def _met(footprint: Spans | None, seat: Seat) -> _HeldPart | None:
    """The part of ``seat``'s outputs that ``footprint`` meets, or None for all of them (an unknown
    footprint, or storages not told apart)."""
    if footprint is None or not seat.storages:
        return None
    met = [i for i, span in enumerate(seat.storages) if span[1] > span[0] and overlap(footprint, (span,))]
    return seat.graph.family.part(met)


class PoolGroup:
    """Graphs captured into one pool, in capture order (Note: [Graphs in one pool]).

    ``handle``: the pool's id for ``capture_begin``; ``members``: the captured graphs (grace.graph, the
    owners of their outputs) captured into it, earliest first, each leaving once it is released and
    no output of it is held any more; ``last_stream``, ``last_stream_key``: the stream order of the
    whole group."""

    def __init__(
        self,
        handle: Any,
        first: Any = None,
        *,
        kin: object = None,
        footprint: Spans | None = None,
        outputs: Spans = (),
        storages: tuple[Span, ...] = (),
    ) -> None:
        self.handle = handle
        self.members: list[Any] = []
        self._seats: dict[int, Seat] = {}
        self._joined = 0  # members that ever joined: the next one's order
        self.last_stream: Any = None
        self.last_stream_key: int | None = None
        self._captured_into = first is not None  # a capture used the pool id
        if first is not None:
            self.join(first, kin=kin, footprint=footprint, outputs=outputs, storages=storages)

    @classmethod
    def around(cls, graph: Any, handle: Any, kin: object) -> PoolGroup:
        """A group with ``graph``, captured alone into pool ``handle``, as its first member: its footprint
        is the whole pool as it is now."""
        footprint = whole_pool(allocator.pool_layout(graph.device, handle))
        return cls(handle, graph, kin=kin, footprint=footprint, storages=graph.pool_storage_spans())

    def capture_handle(self) -> Any:
        """The pool id the next capture into the group uses: a fresh one once a capture used the pool
        and no member holds it any more (a declined or failed capture, a released member): a pool no
        graph uses may be freed, and torch refuses captures into it again."""
        if self._captured_into and not self.members:
            self.handle = allocator.new_pool()
        self._captured_into = True
        return self.handle

    def join(
        self,
        graph: Any,
        *,
        kin: object = None,
        footprint: Spans | None = None,
        outputs: Spans = (),
        storages: tuple[Span, ...] = (),
    ) -> None:
        """``graph`` was captured into the pool after every member; ``footprint``: the memory its replays
        may write (``capture_footprint``); ``storages``: its output storages' spans in its family's order
        (``CapturedGraph.pool_storage_spans``), or only ``outputs``, their union."""
        outputs = outputs or merged(storages)
        with _lock:  # a release in another thread may leave at the same time
            seat = Seat(graph, kin, footprint, outputs, storages, order=self._joined)
            self._joined += 1
            for other in self._seats.values():
                if other.footprint is None or overlap(other.footprint, outputs):
                    other.overwrites.append(Overwrite(seat, _met(other.footprint, seat)))
                if footprint is not None and overlap(footprint, other.outputs):
                    seat.overwrites.append(Overwrite(other, _met(footprint, other)))
            self._seats[id(graph)] = seat
            self.members = [*self.members, graph]

    def leave(self, graph: Any) -> None:
        with _lock:
            seat = self._seats.pop(id(graph), None)
            self.members = [m for m in self.members if m is not graph]
            if seat is not None:
                for other in self._seats.values():
                    other.overwrites = [o for o in other.overwrites if o.seat is not seat]

    def seats(self) -> list[Seat]:
        """The members' seats, earliest captured first (for diagnostics; read only)."""
        with _lock:
            return sorted(self._seats.values(), key=lambda seat: seat.order)

    def seat(self, graph: Any) -> Seat | None:
        return self._seats.get(id(graph))

    def position(self, graph: Any) -> int:
        """Where ``graph`` was captured into the pool, as an order among the members (later captures
        rank higher; past every member when it is not one)."""
        seat = self._seats.get(id(graph))
        return seat.order if seat is not None else self._joined

    def overwritten_held(self, graph: Any, generation: int, args: Sequence[Any] | None) -> bool:
        """Whether a replay of ``graph`` now, in compiled call ``generation`` on ``args``, could overwrite
        a still needed output of another member: one autograd keeps (saved tensors, gradients), one held
        in this call, one this call reads, and any held output of a member that serves another callable.
        A caller's output of an earlier call of the same callable follows the per-call contract (Note:
        [Outputs held within one call] in grace.outputs). Without ``args``, every held output counts."""
        return self.overwritten_held_by(graph, generation, args) is not None

    def overwritten_held_by(self, graph: Any, generation: int, args: Sequence[Any] | None) -> str | None:
        """``overwritten_held``, naming the first member whose still needed output ``graph``'s replay could
        overwrite (its slot's graph id where the member serves a slot), or None."""
        seat = self._seats.get(id(graph))
        if seat is None:
            return None
        for over in seat.overwrites:
            if _still_needed(over, seat.kin, generation, args):
                return str(getattr(over.seat.kin, "graph_id", "another member"))
        return None


def _still_needed(over: Overwrite, kin: object, generation: int, args: Sequence[Any] | None) -> bool:
    """Whether an output of ``over.seat`` that the replay may overwrite (``over.part``) is still needed
    (``PoolGroup.overwritten_held``)."""
    other = over.seat
    family = other.graph.family
    met = family if over.part is None else over.part
    if family.released:
        return bool(met.held_beyond_graph())
    if met.kept_held():
        return True
    if not met.counted_held():
        return False
    if other.kin is not kin or args is None or family.last_generation == generation:
        return True  # another callable's, held in this call, or no way to tell
    return bool(other.graph.outputs_read_by(args, range(len(args))))  # an earlier call's, read now


def for_capture(group: PoolGroup | None, record: Any) -> PoolGroup | None:
    """The group a capture may go into: ``group``, or None (a pool of its own, the reason added to the
    slot's stats ``record``) while an output a member lent lies in memory the allocator counts as free
    and is still held (Note: [Outputs a shared pool lends] in grace.outputs): the capture could take
    that memory."""
    if group is None or not any(member.family.unbacked_held() for member in group.members):
        return group
    why = "an output lent from the shared pool was still held where the capture could have taken it"
    record.add_skip(SkipReason(SkipCode.POOL_OF_ITS_OWN, why))
    return None


def lend_outputs(graph: Any) -> bool:
    """Note: [Outputs a shared pool lends] in grace.outputs: ``graph``, a training graph in a shared pool
    whose deciding call has handed out its outputs, gives up owning them; True when it did. Only where
    every member's footprint is known (the pool's layout), so that replays also spare the outputs of
    members captured earlier that a later capture took the memory of."""
    if graph is None:
        return False
    owner = graph.outputs_owner
    family = owner.family
    if owner.pool_group is None or not family.for_autograd or owner.pool_positions is None:
        return False
    if not (allocator.has_pool_layout() and allocator.has_unowned_storage()):
        return False
    return bool(family.lend(owner.outputs, owner.aliases, owner.device, owner.pool_positions))


_step_groups: dict[int, PoolGroup] = {}


def step_group(device: Any) -> PoolGroup | None:
    """The group a device's training graphs share (Note: [A training step in one pool]; its pool id is
    renewed once no member holds the pool, ``capture_handle``); None where this torch cannot tell a
    capture's footprint."""
    if not allocator.has_pool_layout():
        return None
    index = allocator.device_index(device)
    with _registry_lock:
        group = _step_groups.get(index)
        if group is None:
            group = _step_groups[index] = PoolGroup(allocator.new_pool())
        return group


def step_groups() -> list[PoolGroup]:
    """The step pools made since the last ``forget_step_groups`` (for diagnostics)."""
    with _registry_lock:
        return list(_step_groups.values())


def forget_step_groups() -> None:
    """grace.reset(): later training graphs start a new pool (the released ones leave theirs)."""
    with _registry_lock:
        _step_groups.clear()
