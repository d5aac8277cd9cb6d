"""Graphs in one pool (grace.poolgroups): footprints from the allocator's layout, which member's replay
may overwrite which member's outputs, and a training step's graphs in one pool (option ``step_pool``).
CPU only: captures are fakes whose footprints the tests state; the layout comes from snapshot dicts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import fakes
import pytest
import torch

import grace.runplan
import grace.slot
from grace import poolgroups
from grace.compat import allocator
from grace.compat.allocator import PoolLayout
from grace.compat.aot import GraphRole
from grace.runner import GraceRunner

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("fresh_pool_groups")


# --- footprints -----------------------------------------------------------------------------------


def test_spans_merge_and_meet() -> None:
    assert poolgroups.merged([(30, 40), (0, 10), (10, 20), (35, 50), (60, 60)]) == ((0, 20), (30, 50))
    assert poolgroups.overlap(((0, 10),), ((9, 12),)) and not poolgroups.overlap(((0, 10),), ((10, 12),))


def test_a_captures_footprint_is_the_pool_less_what_others_held_throughout_plus_its_outputs() -> None:
    """Block [50, 60) was in use before and freed during the capture (the capture may take it); [0, 10)
    stayed in use; [20, 30) is the capture's output; [200, 300) a segment the capture added."""
    before = PoolLayout(segments=((0, 100),), allocated=((0, 10), (50, 60)))
    after = PoolLayout(segments=((0, 100), (200, 300)), allocated=((0, 10), (20, 30)))
    footprint = poolgroups.capture_footprint(before, after, ((20, 30),))
    assert footprint == ((10, 100), (200, 300))
    assert poolgroups.capture_footprint(None, after, ((20, 30),)) is None


def _segment(address: int, pool: tuple[int, int], blocks: list[tuple[int, str]], **extra: Any) -> dict:
    return {
        "device": 0,
        "address": address,
        "total_size": sum(size for size, _ in blocks),
        "segment_pool_id": pool,
        "blocks": [{"size": size, "state": state} for size, state in blocks],
        **extra,
    }


def test_a_pools_layout_from_the_allocators_snapshot() -> None:
    """Only the pool's segments on the device count; blocks without an address follow each other."""
    segments = [
        _segment(1000, (0, 7), [(100, "active_allocated"), (50, "inactive"), (20, "active_allocated")]),
        _segment(5000, (0, 0), [(64, "active_allocated")]),  # the default pool
        _segment(9000, (0, 7), [(10, "active_awaiting_free")], device=1),  # another device
        _segment(3000, (0, 7), [(40, "inactive")]),
    ]
    layout = allocator.layout_of(segments, 0, (0, 7))
    assert layout == PoolLayout(segments=((1000, 1170), (3000, 3040)), allocated=((1000, 1100), (1150, 1170)))
    assert allocator.layout_of([{"address": 1, "blocks": []}], 0, (0, 7)) is None  # no pool ids: unknown


def test_a_footprint_from_the_captures_own_allocations_leaves_free_blocks_it_did_not_take() -> None:
    """The layout alone gives every free block ([10, 100) and [200, 300)); the trace says the capture
    took [20, 30) (its output) and [60, 70) (a temporary), and [400, 500) lies outside the pool."""
    before = PoolLayout(segments=((0, 100),), allocated=((0, 10),))
    after = PoolLayout(segments=((0, 100), (200, 300)), allocated=((0, 10), (20, 30)))
    allocated = ((20, 30), (60, 70), (400, 500))
    footprint = poolgroups.capture_footprint(before, after, ((20, 30),), allocated)
    assert footprint == ((20, 30), (60, 70))
    assert poolgroups.capture_footprint(None, None, ((20, 30),), allocated) is None  # no pool: unknown


def test_the_allocations_a_history_names() -> None:
    entries = [
        {"action": "segment_alloc", "addr": 0, "size": 1 << 21},
        {"action": "alloc", "addr": 4096, "size": 100},  # a block spans its request rounded up to 512
        {"action": "free_requested", "addr": 4096, "size": 100},
        {"action": "alloc", "addr": 0, "size": 1024},
    ]
    assert allocator.allocations_of(entries) == ((0, 1024), (4096, 4608))
    assert allocator.allocations_of(entries, limit=4) is None  # the ring may have dropped entries
    assert allocator.allocations_of([{"action": "alloc", "addr": 1}]) is None


class _History:
    """The allocator's history as torch's private functions expose it, on a CPU."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, enabled: bool) -> None:
        self.enabled, self.calls = enabled, []
        self.entries = [{"action": "alloc", "addr": 1024, "size": 512}]
        monkeypatch.setattr(allocator, "has_allocation_history", lambda: True)
        monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", lambda: self.enabled, raising=False)
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", self.record)
        self.segments = [_segment(1024, (0, 7), [(512, "active_allocated")])]
        snapshot = {"segments": self.segments, "device_traces": [self.entries]}
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: snapshot)

    def record(self, enabled: str | None, **kwargs: Any) -> None:
        self.calls.append((enabled, kwargs.get("clear_history", False)))
        self.enabled = enabled is not None


def test_a_trace_turns_the_history_on_and_off_around_what_it_records(monkeypatch: pytest.MonkeyPatch) -> None:
    history = _History(monkeypatch, enabled=False)
    with allocator.AllocationTrace(torch.device("cuda", 0)) as trace:
        assert history.enabled
    assert trace.allocated == ((1024, 1536),)
    assert history.calls == [("all", True), (None, False)] and not history.enabled
    monkeypatch.setattr(allocator, "has_pool_layout", lambda: True)
    monkeypatch.setattr(allocator, "_segments", lambda: pytest.fail("a second snapshot was taken"))
    layout = allocator.pool_layout(torch.device("cuda", 0), (0, 7), trace.segments)  # the trace's own
    assert layout == PoolLayout(segments=((1024, 1536),), allocated=((1024, 1536),))
    with pytest.raises(RuntimeError), allocator.AllocationTrace(torch.device("cuda", 0)) as failed:
        raise RuntimeError("the capture failed")
    assert failed.allocated is None and not history.enabled
    with allocator.AllocationTrace(torch.device("cuda", 0), active=False) as idle:
        pass
    assert idle.allocated is None and len(history.calls) == 4


def test_a_trace_leaves_a_recording_it_did_not_start_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    history = _History(monkeypatch, enabled=True)
    with allocator.AllocationTrace(torch.device("cuda", 0)) as trace:
        pass
    assert trace.allocated is None and history.calls == [] and history.enabled


def test_no_layout_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA build with a device: the layout is known")
    assert allocator.pool_layout(CPU, (0, 1)) is None


# --- which replay may overwrite which outputs -----------------------------------------------------


class _StubFamily:
    def __init__(
        self, *, kept: bool = False, held: bool = False, generation: int = 1, released: bool = False
    ):
        self.kept, self.held, self.last_generation, self.released = kept, held, generation, released

    def kept_held(self) -> bool:
        return self.kept

    def counted_held(self) -> bool:
        return self.held

    def held_beyond_graph(self) -> bool:
        return self.held


class _StubGraph:
    def __init__(self, family: _StubFamily, read: bool = False) -> None:
        self.family, self.read = family, read

    def outputs_read_by(self, args: Sequence[Any], indices: Sequence[int]) -> bool:
        return self.read


@pytest.mark.parametrize(
    ("later", "args", "blocked"),
    [
        (_StubGraph(_StubFamily()), (1,), False),  # nothing of the later set held
        (_StubGraph(_StubFamily(kept=True, held=True, generation=1)), (1,), True),  # saved tensors
        (_StubGraph(_StubFamily(held=True, generation=5)), (1,), True),  # a caller's output of this call
        (_StubGraph(_StubFamily(held=True, generation=4)), (1,), False),  # of an earlier call: contract
        (_StubGraph(_StubFamily(held=True, generation=4), read=True), (1,), True),  # ... that it reads
        (_StubGraph(_StubFamily(held=True, generation=4)), None, True),  # no args: every holder counts
        (_StubGraph(_StubFamily(held=True, released=True)), (1,), True),  # released, output alive
        (_StubGraph(_StubFamily(held=False, released=True)), (1,), False),
    ],
)
def test_which_outputs_of_a_later_set_block_an_earlier_sets_replay(
    later: _StubGraph, args: Sequence[Any] | None, blocked: bool
) -> None:
    """Note: [Graphs in one pool]: ``PoolGroup.overwritten_held`` in compiled call 5, footprints unknown.
    Only sets captured after the replaying one count: the earlier one never blocks the later one."""
    first = _StubGraph(_StubFamily(kept=True, held=True))
    group = poolgroups.PoolGroup((0, 1), first)
    group.join(later)
    assert group.overwritten_held(first, 5, args) is blocked
    assert group.overwritten_held(later, 5, args) is False


def test_a_replay_spares_only_the_members_its_footprint_meets() -> None:
    """A's capture may have written [0, 100): B's outputs lie there, C's in a segment added after A.
    So A's replay waits for B's held gradients, never for C's; B's and C's replays never wait for A."""
    a, b, c = _StubGraph(_StubFamily()), _StubGraph(_StubFamily()), _StubGraph(_StubFamily())
    group = poolgroups.PoolGroup((0, 1), a, footprint=((0, 100),), outputs=((0, 10),))
    group.join(b, footprint=((10, 60),), outputs=((20, 30),))
    group.join(c, footprint=((200, 300),), outputs=((200, 210),))
    c.family.kept = c.family.held = True
    assert not group.overwritten_held(a, 5, (1,))
    b.family.kept = b.family.held = True
    assert group.overwritten_held(a, 5, (1,))
    a.family.kept = a.family.held = True
    assert not group.overwritten_held(b, 5, (1,)) and not group.overwritten_held(c, 5, (1,))
    group.leave(b)
    assert not group.overwritten_held(a, 5, (1,)) and [id(m) for m in group.members] == [id(a), id(c)]


def test_an_unknown_footprint_overwrites_every_later_member() -> None:
    a, b = _StubGraph(_StubFamily()), _StubGraph(_StubFamily(kept=True, held=True))
    group = poolgroups.PoolGroup((0, 1), a)  # footprint unknown
    group.join(b, footprint=((500, 600),), outputs=((500, 510),))
    assert group.overwritten_held(a, 5, (1,)) and not group.overwritten_held(b, 5, (1,))


@pytest.mark.parametrize(
    ("kin_of_b", "generation", "blocked"),
    [
        ("layer", 4, False),  # the same callable's output of an earlier call: the per-call contract
        ("layer", 5, True),  # ... of this call
        ("loss", 4, True),  # another callable's output, of any call: no contract covers it
    ],
)
def test_held_outputs_of_another_callable_always_count(kin_of_b: str, generation: int, blocked: bool) -> None:
    a, b = _StubGraph(_StubFamily()), _StubGraph(_StubFamily(held=True, generation=generation))
    group = poolgroups.PoolGroup((0, 1), a, kin="layer", footprint=((0, 100),), outputs=((0, 10),))
    group.join(b, kin=kin_of_b, footprint=((50, 60),), outputs=((50, 60),))
    assert group.overwritten_held(a, 5, (1,)) is blocked


def test_the_step_pool_needs_the_layout_and_takes_a_fresh_id_once_no_member_holds_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A capture declined before it joined, and a group whose members all left, leave a pool that may
    be freed: the next capture takes a new id. While a member holds the pool, every capture shares it."""
    cuda = torch.device("cuda", 0)  # a device object only: nothing runs on it
    monkeypatch.setattr(allocator, "has_pool_layout", lambda: False)
    assert poolgroups.step_group(cuda) is None
    handles = iter([(0, 41), (0, 42), (0, 43), (0, 44)])
    monkeypatch.setattr(allocator, "has_pool_layout", lambda: True)
    monkeypatch.setattr(allocator, "new_pool", lambda: next(handles))
    group = poolgroups.step_group(cuda)
    assert group is not None and poolgroups.step_group(cuda) is group
    assert group.capture_handle() == (0, 41)  # declined: it never joins
    assert group.capture_handle() == (0, 42)
    member = _StubGraph(_StubFamily())
    group.join(member)
    assert group.capture_handle() == (0, 42) and group.capture_handle() == (0, 42)
    group.leave(member)
    assert group.capture_handle() == (0, 43)
    other = poolgroups.step_group(torch.device("cuda", 1))
    assert other is not None and other is not group and other.handle == (0, 44)  # a group per device


def test_a_graph_in_a_pool_counts_only_the_outputs_in_its_pool() -> None:
    """A forward returns a parameter for its backward: its storage is no output in the pool, so it
    neither lies in the graph's footprint nor makes another member overwrite it."""
    weight = torch.ones(4)
    graph = fakes.captured_graph(
        fakes.CountingReplay(), placeholders={}, outputs=[torch.zeros(3), weight], kept_from=0
    )
    graph.pool_positions = frozenset({0})
    out = graph.outputs[0].untyped_storage()
    assert graph.output_spans() == ((out.data_ptr(), out.data_ptr() + out.nbytes()),)


# --- a training step's graphs in one pool -----------------------------------------------------------


def _step_runners(
    monkeypatch: pytest.MonkeyPatch, generation: list[int], footprints_known: bool
) -> tuple[GraceRunner, GraceRunner, list[tuple[GraphRole, list[torch.Tensor]]]]:
    """A forward (returns ``x * 2`` to the caller and saves ``x + 1``) and a backward (two gradients,
    ``g * 2`` and ``g + 1``) over fake captures into the device's step pool. A capture's footprint is its
    own outputs (``footprints_known``) or unknown."""
    captures: list[tuple[GraphRole, list[torch.Tensor]]] = []
    placeholders = {GraphRole.FORWARD: torch.zeros(2, 3), GraphRole.BACKWARD: torch.zeros(2, 3)}
    group = poolgroups.PoolGroup((0, 9))
    monkeypatch.setattr(grace.runplan, "step_group", lambda device: group)

    def capture(facts: Any, args: Sequence[Any]) -> Any:
        role = facts.plan.role
        own, placeholder = [torch.zeros(2, 3), torch.zeros(2, 3)], placeholders[role]
        captures.append((role, own))

        class Writes:
            def replay(self) -> None:
                own[0].copy_(placeholder * 2)
                own[1].copy_(placeholder + 1)

        graph = fakes.captured_graph(
            Writes(), placeholders={0: placeholder}, outputs=list(own), kept_from=facts.plan.kept_from
        )
        assert facts.pool_group is group  # both roles capture into the step's pool
        footprint = graph.output_spans() if footprints_known else None
        graph.join_pool_group(facts.pool_group, facts.record, footprint)
        return graph

    forward, backward = fakes.step_runners(monkeypatch, capture, generation)
    return forward, backward, captures


@pytest.mark.parametrize("footprints_known", [False, True])
def test_a_forward_in_the_step_pool_spares_a_held_gradient_it_may_overwrite(
    monkeypatch: pytest.MonkeyPatch, footprints_known: bool
) -> None:
    """The first step's gradient stays held (as a ``.grad`` that is never zeroed). The forward, captured
    before the backward into the same pool, may overwrite it where its footprint is unknown: from then
    on it replays a second set, captured after the backward's first. Where its footprint is its own
    outputs only, it replays its first set throughout. Every value is the eager one, every call."""
    generation = [1]
    forward, backward, captures = _step_runners(monkeypatch, generation, footprints_known)
    forward(torch.zeros(2, 3))  # warm-up
    backward(torch.zeros(2, 3))
    held: list[tuple[torch.Tensor, torch.Tensor]] = []
    for step in range(2, 6):
        generation[0] = step
        x = torch.full((2, 3), float(step))
        out, saved = forward(x)
        torch.testing.assert_close(out, x * 2)
        torch.testing.assert_close(saved, x + 1)
        grad = backward(saved)[0]  # the other gradient dies at once
        torch.testing.assert_close(grad, (x + 1) * 2)
        if not held:
            held.append((grad, (x + 1) * 2))  # kept past the step, as a ``.grad`` would be
        for value, expected in held:
            torch.testing.assert_close(value, expected)
        del out, saved, grad
    roles = [role for role, _ in captures]
    assert roles.count(GraphRole.FORWARD) == (1 if footprints_known else 2)
    assert roles.count(GraphRole.BACKWARD) == 2  # the first set's gradient is held


def test_a_steps_graphs_are_all_captured_in_one_step_in_the_order_it_runs_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note: [Captures of a step in one step] in grace.warmup: a forward serving two layers a step and its
    backward warm up through the whole first step, then every capture of the pool (an output set per
    layer, forward then backward) happens in the second step, in the order the step runs them; the
    third step captures nothing and every value is the eager one."""
    generation = [1]
    forward, backward, captures = _step_runners(monkeypatch, generation, footprints_known=True)
    captured_in: list[int] = []
    for step in (1, 2, 3):
        generation[0] = step
        saved = []
        for layer in (1, 2):
            x = torch.full((2, 3), float(10 * step + layer))
            out, kept = forward(x)
            torch.testing.assert_close(out, x * 2)
            saved.append((kept, x + 1))
            captured_in += [step] * (len(captures) - len(captured_in))
        for kept, expected in reversed(saved):
            torch.testing.assert_close(kept, expected)
            grads = backward(kept)
            torch.testing.assert_close(grads[0], expected * 2)
            captured_in += [step] * (len(captures) - len(captured_in))
        del saved, kept, grads, out
    roles = [role for role, _ in captures]
    assert roles == [GraphRole.FORWARD] * 2 + [GraphRole.BACKWARD] * 2
    assert captured_in == [2, 2, 2, 2]


def test_a_failed_capture_ends_the_routing_to_its_pool_where_torch_left_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch stops routing allocations to a pool only once ``cudaStreamEndCapture`` succeeds; after a
    failed capture into a shared pool grace ends it, and a pool no longer routed to is no error."""
    calls: list[tuple[int, tuple[int, int]]] = []

    def end(device: int, pool: tuple[int, int]) -> None:
        calls.append((device, pool))
        if len(calls) > 1:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")

    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", end, raising=False)
    allocator.end_routing(torch.device("cuda", 1), (0, 7))
    allocator.end_routing(torch.device("cuda", 1), (0, 7))  # nothing routed any more: no error
    assert calls == [(1, (0, 7)), (1, (0, 7))]
