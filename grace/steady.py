"""The steady call: a compiled call that only replays its graph, checked and launched in a few steps.

Problem: once a slot replays its graph, nearly every call finds nothing changed, yet the general path
(grace.runner, grace.slot, grace.graph) asks its questions through some twenty Python frames, one per
concern: pools waiting for release, the calling thread, the signature, the slot's state, moved static
inputs, held outputs, threads, pool groups, verification, the stream order. On a GPU host every call
runs that code cold (the driver's launch path runs between two calls), so it costs about twice what a
warm loop of it measures, and all of it comes before the launch, where a synchronised call waits for it
(docs/REPLAY_PATH.md).

Note: [The steady call]
After a call through the runner's recent slot (grace.recent) replayed a graph, the runner builds a
``SteadyCall`` for that slot and graph, where the graph can take it: no input adapter, no
``clone_outputs``, outputs autograd does not keep, a PI or copies variant. A graph that writes an input
it reads through a placeholder (a decode step's KV cache) takes it too: the variant's replay copies the
written value back, as on the general path.
Each later call asks it first, under the runner's lock. It answers ``MISS`` before doing anything
unless the general path would do exactly a plain replay with nothing else:
- one calling thread so far, this one (the runner releases the pools whose outputs died before it
  asks, as the general path does first, so a pool whose outputs are still held causes no miss);
- the recent slot is still the runner's, and the call has its signature (the same C++ check);
- the slot is in state GRAPH with the same graph and variant, and no verification is due (no replay
  left to compare, the dynamic inputs where the decision saw them or that check already made);
- the static inputs sit where they were at capture;
- the graph's outputs: never shared across threads, no rebound graph writing them, in no pool group,
  last replayed by this thread in an earlier compiled call (Note: [Outputs held within one call] in
  grace.outputs), on the stream the call runs on now (Note: [Stream order] in grace.streams).
On a hit it counts the call, notes the replay as the slot would, and runs the variant's replay with the
stream order already checked; a replay that raises takes the slot's failure path. A ``SteadyCall`` whose
slot has moved on from its graph or variant answers ``STALE`` (a miss the runner drops it for); the
runner also drops it with its slots (reset, release, eviction).

Invariants: a miss has no effect; a hit has exactly the effects of the general path's plain replay;
nothing here decides anything the general path would decide otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from grace import streams
from grace.compat import torch as torch_compat
from grace.graph import CapturedGraph
from grace.recent import RecentSlot
from grace.slot import GraphSlot, SlotState
from grace.variants import CopiesSpec, PISpec

MISS = object()  # the answer of a SteadyCall whose conditions do not hold: take the general path
STALE = object()  # a miss because the slot moved on from the SteadyCall's graph: the runner drops it


class SteadyCall:
    """Note: [The steady call]: the plain replay of one slot's graph, for the thread that built it."""

    __slots__ = ("family", "graph", "recent", "record", "replay", "slot", "spec", "thread")

    def __init__(
        self, recent: RecentSlot[GraphSlot], graph: CapturedGraph, replay: Callable[..., Any]
    ) -> None:
        slot = recent.slot
        self.recent, self.slot, self.replay = recent, slot, replay
        self.graph, self.spec, self.record, self.family = graph, slot.spec, slot.record, graph.family
        self.thread = threading.get_ident()

    @classmethod
    def of(cls, recent: RecentSlot[GraphSlot], clone_outputs: bool) -> SteadyCall | None:
        """One for ``recent``'s slot where its graph can take the steady call, else None."""
        slot = recent.slot
        graph, spec = slot.graph, slot.spec
        if slot.state is not SlotState.GRAPH or not isinstance(graph, CapturedGraph) or clone_outputs:
            return None
        if graph.origin is not None or graph.family.for_autograd:
            return None
        if isinstance(spec, PISpec) and graph.pi_plan is not None:
            return cls(recent, graph, graph.run_with_pi)
        if isinstance(spec, CopiesSpec):
            return cls(recent, graph, graph.run_with_copies)
        return None

    def __call__(self, runner_recent: Any, args: Sequence[Any]) -> Any:
        """The outputs of a plain replay, or ``MISS`` or ``STALE`` with nothing done (the Note)."""
        slot, graph, family = self.slot, self.graph, self.family
        if slot.state is not SlotState.GRAPH or slot.graph is not graph or slot.spec is not self.spec:
            return STALE
        ident = threading.get_ident()
        if (
            ident != self.thread
            or runner_recent is not self.recent
            or streams.calling_threads.first != ident
            or streams.calling_threads.several
            or slot.verify_calls
            or family.threads_shared
            or family.sharers
            or graph.pool_group is not None
            or family.last_thread != ident
            or not self.recent.matches(args)
            or (graph.static_indices and not graph.static_inputs_unmoved(args))
            or (slot.verify_ptrs is not None and slot.inputs_moved(args))
            or streams.current_stream_key(graph.device) != family.last_stream_key
        ):
            return MISS
        generation = torch_compat.compiled_call_generation()
        if generation == family.last_generation:
            return MISS  # again within one compiled call: the general path decides
        family.note_replay(generation, id(graph))  # as CapturedGraph.note_replay: the graph owns its outputs
        record = self.record
        record.calls += 1
        record.graph_calls += 1
        try:
            return self.replay(args, False, True)
        except Exception as exc:
            return slot.replay_failed(args, exc)
