"""Which of a slot's output sets a call replays.

Note: [Output sets]
A graph's outputs are counted as held (``HeldState.HELD``): a forward whose saved tensors a pending
backward needs (two micro-batches, or one compiled layer called for each layer of a model), a backward
whose gradients are a parameter's ``.grad``, outputs held within one call. Eager would allocate fresh
outputs; a graph has one set. So a slot (grace.slot) keeps several graphs of the same signature and
static inputs, each with outputs of its own (in its ``kept`` list, beside the graphs of other static
addresses): a call replays one whose outputs nothing holds, or, while the slot has fewer than option
``max_output_sets`` for these static inputs (``GraceOptions.output_sets``: 16 for a training step's
graphs by default, 1 for others), makes a new one with a deciding call of its own (captured, checked
against the no-graph run, the slot's previous decision kept when it passes); past that bound it runs
without a graph. A graph replays only when nothing holds its own outputs.

Design: ``free_set`` picks the set, comparing static inputs only for the sets it reaches. Sets in pools
of their own are tried least recently kept first: where one compiled layer serves every layer of a step,
the set a layer took a step before is free and comes first, while the sets this step took are held
(tried most recent first, every call walked those: a step's checks grew with the square of its layers).
Sets in one pool (Note: [Graphs in one pool] in grace.poolgroups) are tried earliest first, as a stack: a set
may replay only while the sets captured after it are free, so layer 1 takes the first set, layer 2 the
second, and the next step starts again from the first; the latest set taken for layer 1 would block
every earlier one for layer 2, and the slot would make a new set at every step. A replay whose own set
is free first looks for an earlier free one (``earlier_free_set``); one whose set is held goes to
``free_set`` at once, which tries every set earliest first.

Note: [One new set per call]
A deciding call ends with a replay of the set it just made. Where that replay is refused (in a shared
pool, an output of another member under the new set's footprint is still held), the call makes no
further set: it runs without a graph, the new set stays with the slot with its first replay checked
against the no-graph callable, and later calls take it when it is free or make the next one. Made
within the deciding call, each further set would meet the same held output, so one call could make
sets to the bound, every one kept allocated.

Invariants: a set is picked only when ``held_outputs`` says a replay overwrites nothing held; a call
makes at most one set.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from grace.outputs import HeldState
from grace.poolgroups import PoolGroup
from grace.reasons import SkipCode, SkipReason

HELD = SkipReason(
    SkipCode.OUTPUTS_HELD,
    "the graph runs again while outputs of its previous replay may be held (within one compiled call, "
    "by a call from another thread, or every output set taken); such calls run without the graph",
)
NEW_SET_REFUSED = SkipReason(
    SkipCode.OUTPUTS_HELD,
    "a deciding call's replay of the output set it made was refused (set_blocks says for what): that call "
    "ran without the graph and made no further set (Note: [One new set per call] in grace.outputsets)",
)


def same_inputs(kept: Sequence[Any], args: Sequence[Any]) -> list[int]:
    """Indices in ``kept`` (a slot's kept graphs, each with ``.graph``) of the sets for the static inputs
    of ``args``."""
    return [i for i, k in enumerate(kept) if k.graph.static_inputs_unmoved(args)]


def free_set(
    kept: Sequence[Any], args: Sequence[Any], generation: int, group: PoolGroup | None
) -> int | None:
    """The index in ``kept`` of the set for the static inputs of ``args`` this call can replay, in the
    order of the module docstring, or None. ``group``: the pool the slot's sets share (None: pools of
    their own). The static inputs are compared only for the sets the order reaches."""
    indices = range(len(kept))
    order = indices if group is None else _earliest_first(kept, indices, group, None)
    return _first_free(kept, order, args, generation)


def earlier_free_set(
    kept: Sequence[Any], args: Sequence[Any], generation: int, group: PoolGroup, before: int
) -> int | None:
    """The index in ``kept`` of the earliest set captured into ``group`` before position ``before``, for
    the static inputs of ``args``, that this call can replay, or None. Asked on every replay of a set in
    a shared pool: the order is read first, and the static inputs only of the sets it leaves."""
    order = _earliest_first(kept, range(len(kept)), group, before)
    return _first_free(kept, order, args, generation)


def _earliest_first(
    kept: Sequence[Any], indices: Iterable[int], group: PoolGroup, before: int | None
) -> list[int]:
    ranked = sorted((group.position(kept[i].graph.outputs_owner), i) for i in indices)
    return [i for rank, i in ranked if before is None or rank < before]


def _first_free(
    kept: Sequence[Any], order: Sequence[int], args: Sequence[Any], generation: int
) -> int | None:
    for i in order:
        graph = kept[i].graph
        if not graph.static_inputs_unmoved(args):
            continue
        if graph.held_outputs(generation, args) is HeldState.NONE:
            return i
    return None


def note_why_taken(
    record: Any,
    kept: Sequence[Any],
    candidates: Sequence[int],
    current: Any,
    generation: int,
    args: Sequence[Any],
) -> None:
    """Count in ``record`` (the slot's stats, ``set_blocks``) why each set a call found taken was taken
    (the ``candidates`` of ``kept`` and the slot's ``current`` graph, if any): the checks of
    ``held_outputs``, in words (``why_held``). The diagnosis of a slot that keeps making sets."""
    taken = [kept[i].graph for i in candidates] + ([current] if current is not None else [])
    record.note_set_blocks(graph.why_held(generation, args)[1] for graph in taken)
