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

Design: ``free_set`` picks the set. Sets in pools of their own are tried most recent first. Sets in
one pool (Note: [Graphs in one pool] in grace.poolgroups) are tried earliest first, as a stack: a set
may replay only while the sets captured after it are free, so layer 1 takes the first set, layer 2 the
second, and the next step starts again from the first; the latest set taken for layer 1 would block
every earlier one for layer 2, and the slot would make a new set at every step.

Invariant: a set is picked only when ``held_outputs`` says a replay overwrites nothing held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grace.outputs import HeldState
from grace.poolgroups import PoolGroup


def same_inputs(kept: Sequence[Any], args: Sequence[Any]) -> list[int]:
    """Indices in ``kept`` (a slot's kept graphs, each with ``.graph``) of the sets for the static inputs
    of ``args``."""
    return [i for i, k in enumerate(kept) if k.graph.static_inputs_unmoved(args)]


def free_set(
    kept: Sequence[Any],
    candidates: Sequence[int],
    args: Sequence[Any],
    generation: int,
    group: PoolGroup | None,
    before: int | None = None,
) -> int | None:
    """The index, among ``candidates`` (``same_inputs``) of ``kept``, of the set this call can replay,
    in the order of the module docstring, or None. ``group``: the pool the slot's sets share (None:
    pools of their own); ``before``: only sets captured into it before that position."""
    if group is None:
        order = list(candidates)[::-1]
    else:
        ranked = sorted((group.position(kept[i].graph.outputs_owner), i) for i in candidates)
        order = [i for rank, i in ranked if before is None or rank < before]
    for i in order:
        if kept[i].graph.held_outputs(generation, args) is HeldState.NONE:
            return i
    return None
