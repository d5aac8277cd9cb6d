"""Outputs a shared pool lends (Note: [Outputs a shared pool lends] in grace.outputs): a training graph in
a shared pool gives up owning its outputs once its deciding call handed them out, its held checks count
both storages, and no capture goes into the pool while a lent output in memory the allocator counts as
free is still held. CPU only: the outputs' memory is numpy arrays, which outlive the storages that owned
it, as a pool's blocks outlive the tensors the allocator handed out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import fakes
import numpy as np
import pytest
import torch

import grace.runplan
import grace.slot
from grace import poolgroups, stats
from grace.compat import allocator
from grace.compat import torch as torch_compat
from grace.compat.aot import GraphRole
from grace.outputs import OutputFamily
from grace.runner import GraceRunner
from grace.scg import Variant

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("fresh_pool_groups")


def _record() -> stats.GraphStats:
    return stats.new_record(0, "h", "*", "cpu", Variant.NO_GRAPH)


def _use(t: torch.Tensor) -> int:
    return torch_compat.storage_use_count(torch_compat.storage_weak_ref(t)) - 1  # less the probe's own


def test_unowned_tensors_share_the_memory_and_own_none_of_it() -> None:
    base = torch.arange(12.0)
    first, second = base[:6].view(2, 3), base[6:]
    lent = allocator.unowned_like([first, second])
    assert [t.shape for t in lent] == [first.shape, second.shape]
    assert [t.stride() for t in lent] == [first.stride(), second.stride()]
    assert [t.storage_offset() for t in lent] == [0, 6]
    assert lent[0].untyped_storage()._cdata == lent[1].untyped_storage()._cdata  # one storage again
    assert lent[0].untyped_storage()._cdata != base.untyped_storage()._cdata
    before = _use(base)
    more = allocator.unowned_like([base])
    assert _use(base) == before  # counted on its own storage only
    base[7] = 70.0
    assert lent[1][1].item() == 70.0 and more[0][7].item() == 70.0


def _numpy_outputs(count: int) -> tuple[list[np.ndarray], list[torch.Tensor]]:
    """Outputs whose storages own nothing but a reference to arrays the caller keeps."""
    arrays = [np.zeros((2, 3), dtype=np.float32) for _ in range(count)]
    return arrays, [torch.from_numpy(a) for a in arrays]


def test_a_lent_output_is_held_through_either_storage() -> None:
    arrays, outputs = _numpy_outputs(2)
    family = OutputFamily.of(outputs, (), CPU, kept_from=1)
    handed = [t.detach() for t in outputs]  # the deciding call's outputs, aliases of the owned storages
    assert family.lend(outputs, (), CPU, frozenset({0, 1}))
    assert not family.lend(outputs, (), CPU, frozenset({0, 1}))  # once
    assert all(o is not None for o in family.owners)
    assert family.kept_held() and family.counted_held()  # the saved tensor, through its owned storage
    assert not family.unbacked_held()  # its memory is still the allocator's
    del handed
    assert not family.counted_held() and not family.kept_held()
    replayed = [t.detach() for t in outputs]  # a replay's aliases: of the unowned storages
    assert family.kept_held() and family.unbacked_held()
    del replayed
    assert not family.counted_held() and not family.unbacked_held()
    assert len(family.all_refs()) == 4
    assert arrays  # the memory outlived both storages


def test_a_part_of_a_family_answers_for_its_own_storages_lent_or_not() -> None:
    """Note: [What a replay can overwrite] in grace.poolgroups: a replay whose footprint meets only the
    result (storage 0) waits for the result, not for the tensor autograd keeps (storage 1), before and
    after the outputs are lent (the family's references replaced), and after the graph is released."""
    arrays, outputs = _numpy_outputs(2)
    family = OutputFamily.of(outputs, (), CPU, kept_from=1)
    result, kept = family.part([0]), family.part([1])
    handed = [t.detach() for t in outputs]
    assert family.kept_held() and kept.kept_held() and not result.kept_held()
    del handed[0]  # the caller dropped the result
    assert family.counted_held() and kept.counted_held() and not result.counted_held()
    assert family.lend(outputs, (), CPU, frozenset({0, 1}))
    assert kept.kept_held() and not result.counted_held()  # rebuilt over the new references
    replayed = [t.detach() for t in outputs]
    del handed
    assert result.counted_held() and not result.kept_held() and kept.kept_held()
    del replayed[1]
    assert not kept.counted_held() and result.counted_held()
    family.released = True  # the graph dropped its own tensors
    outputs.clear()
    assert result.held_beyond_graph() and not kept.held_beyond_graph()
    assert family.part([5]).counted_held() == family.counted_held()  # past the references: the family's
    assert arrays


def test_only_outputs_in_the_pool_are_lent() -> None:
    """A parameter a forward returns for its backward is no output in the pool: it stays owned."""
    weight = torch.ones(4)
    _, (out,) = _numpy_outputs(1)
    outputs: list[Any] = [out, weight]
    family = OutputFamily.of(outputs, (), CPU, kept_from=0)
    assert family.lend(outputs, (), CPU, frozenset({0}))
    assert outputs[1] is weight and outputs[0] is not out
    assert sum(owner is None for owner in family.owners) == 1


# --- a training step in one pool, end to end --------------------------------------------------------


def _step(
    monkeypatch: pytest.MonkeyPatch, generation: list[int]
) -> tuple[GraceRunner, GraceRunner, list[tuple[GraphRole, Any]], poolgroups.PoolGroup]:
    """A forward (returns ``x * 2`` to the caller and saves ``x + 1``) and a backward (``g * 2`` and
    ``g + 1``) over fake captures whose outputs' memory outlives their storages; each capture notes its
    role and the group it was given, and joins it with its outputs as its footprint."""
    captures: list[tuple[GraphRole, Any]] = []
    group = poolgroups.PoolGroup((0, 9))
    monkeypatch.setattr(grace.runplan, "step_group", lambda device: group)
    monkeypatch.setattr(allocator, "has_pool_layout", lambda: True)
    kept: list[Any] = []  # the pool's memory: lives as long as the test

    def capture(facts: Any, args: Sequence[Any]) -> Any:
        role = facts.plan.role
        arrays, own = _numpy_outputs(2)
        writers = [torch.from_numpy(a) for a in arrays]  # the replay's own view of that memory
        placeholder = torch.zeros(2, 3)
        kept.append((arrays, writers))
        captures.append((role, facts.pool_group))

        class Writes:
            def replay(self) -> None:
                writers[0].copy_(placeholder * 2)
                writers[1].copy_(placeholder + 1)

        graph = fakes.captured_graph(
            Writes(), placeholders={0: placeholder}, outputs=own, kept_from=facts.plan.kept_from
        )
        graph.pool_positions = frozenset({0, 1})
        if facts.pool_group is not None:
            graph.join_pool_group(facts.pool_group, facts.record, graph.output_spans())
        return graph

    forward, backward = fakes.step_runners(monkeypatch, capture, generation)
    return forward, backward, captures, group


def test_a_step_pool_lends_outputs_and_captures_elsewhere_while_a_lent_one_is_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Step 2 captures the forward and the backward into the step's pool; both lend their outputs once
    handed out. In step 3 the forward's replay hands out aliases of memory the allocator counts as free:
    while the saved one is held, the second layer's forward (a new output set) is captured into a pool of
    its own. Every value is the eager one, every call."""
    generation = [1]
    forward, backward, captures, group = _step(monkeypatch, generation)
    forward(torch.zeros(2, 3))  # warm-up
    backward(torch.zeros(2, 3))
    generation[0] = 2
    x = torch.full((2, 3), 2.0)
    out, saved = forward(x)
    first = forward.slots[next(iter(forward.slots))].graph
    assert first is not None and first.family.owners  # lent
    assert poolgroups.for_capture(group, _record()) is group  # what was handed out still owns the memory
    grad = backward(saved)[0]
    torch.testing.assert_close((out, saved, grad), (x * 2, x + 1, (x + 1) * 2))
    assert [g is group for _, g in captures] == [True, True]
    del out, saved, grad

    generation[0] = 3
    x = torch.full((2, 3), 3.0)
    out, saved = forward(x)  # a replay of the lent set
    torch.testing.assert_close((out, saved), (x * 2, x + 1))
    assert first.family.unbacked_held() and poolgroups.for_capture(group, _record()) is None
    out2, saved2 = forward(x + 1)  # the next layer: the first set's saved tensor is held
    torch.testing.assert_close((out2, saved2), ((x + 1) * 2, x + 2))
    assert [g is group for _, g in captures] == [True, True, False]  # a pool of its own, and why
    assert "pool_of_its_own" in [
        r.code.value for r in forward.slots[next(iter(forward.slots))].record.skip_reasons
    ]
    grads = [backward(saved2)[0], backward(saved)[0]]
    torch.testing.assert_close(grads, [(x + 2) * 2, (x + 1) * 2])
    del out, saved, out2, saved2, grads
    assert poolgroups.for_capture(group, _record()) is group


def test_a_replay_spares_a_lent_output_of_an_earlier_member_its_capture_took() -> None:
    """B's capture took memory A had lent (A's outputs had died): B's replay then waits while A's
    outputs are held again, as A's waits for B's."""
    _, a_out = _numpy_outputs(1)
    a = fakes.captured_graph(fakes.CountingReplay(), placeholders={}, outputs=a_out, kept_from=0)
    a.pool_positions = frozenset({0})
    group = poolgroups.PoolGroup((0, 1))
    a.join_pool_group(group, "layer", a.output_spans())
    _, b_out = _numpy_outputs(1)
    b = fakes.captured_graph(fakes.CountingReplay(), placeholders={}, outputs=b_out, kept_from=0)
    b.pool_positions = frozenset({0})
    b.join_pool_group(group, "layer", (*a.output_spans(), *b.output_spans()))
    assert a.family.lend(a.outputs, (), CPU, a.pool_positions)
    held = a.outputs[0].detach()
    assert group.overwritten_held(b, 5, (torch.zeros(1),))
    del held
    assert not group.overwritten_held(b, 5, (torch.zeros(1),))
