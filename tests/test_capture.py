"""grace.capture's pure parts on CPU: placeholders fresh or shared between two captures of the same
inputs (with their layout checked), and zero poisoning of placeholders."""

from __future__ import annotations

from typing import Any

import fakes
import pytest
import torch
from fakes import CountingReplay

from grace.capture import (
    CapturedGraph,
    borrow_blocker,
    own_placeholder_inputs,
    placeholders_for,
    poison_placeholders,
)
from grace.pi_contract import PlanDefaults


def test_fresh_placeholders_have_the_inputs_layout_at_other_addresses() -> None:
    x = torch.randn(4, 6)[:, ::2]  # strided view
    y = torch.randn(3).expand(5, 3)  # broadcast: stride 0
    held = placeholders_for([x, y, 7], (0, 1))
    assert set(held) == {0, 1}
    for i, t in ((0, x), (1, y)):
        p = held[i]
        assert (p.shape, p.stride(), p.dtype) == (t.shape, t.stride(), t.dtype)
        assert p.data_ptr() != t.data_ptr()


def test_shared_placeholders_are_the_same_tensors() -> None:
    args = [torch.randn(8), torch.randn(2, 3)]
    first = placeholders_for(args, (0, 1))
    second = placeholders_for(args, (0, 1), first)
    assert second is not first  # a graph dropping its dict leaves the other's intact
    assert all(second[i] is first[i] for i in (0, 1))


@pytest.mark.parametrize(
    ("other", "message"),
    [
        (torch.randn(9), r"input 0 is \(8,\)"),  # shape
        (torch.randn(16)[::2], "input 0"),  # stride
        (torch.randn(8, dtype=torch.float64), "float64"),  # dtype
    ],
)
def test_shared_placeholders_must_match_each_input(other: torch.Tensor, message: str) -> None:
    args = [torch.randn(8), torch.randn(2)]
    shared = placeholders_for(args, (0, 1))
    shared[0] = other
    with pytest.raises(ValueError, match=message):
        placeholders_for(args, (0, 1), shared)


def test_shared_placeholders_must_cover_exactly_the_dynamic_inputs() -> None:
    args = [torch.randn(8), torch.randn(2)]
    shared = placeholders_for(args, (0,))
    with pytest.raises(ValueError, match=r"cover inputs \[0\], the capture needs \[0, 1\]"):
        placeholders_for(args, (0, 1), shared)


def test_poison_zeroes_every_placeholder() -> None:
    floats = torch.full((6,), 3.0)
    broadcast = torch.ones(3).expand(4, 3)
    complex_ = torch.ones(2, dtype=torch.complex64)
    ints = torch.arange(1, 6)
    poison_placeholders({0: floats, 1: broadcast, 2: complex_, 3: ints})
    for t in (floats, broadcast, complex_, ints):
        assert not t.any()


# --- graphs captured on the caller's inputs (option pi_direct) ----------------------------------------


def test_borrowing_needs_cuda_tensors_and_reads_one_input_per_storage_in_place() -> None:
    assert borrow_blocker([torch.zeros(2), 3], (0, 1)) == "input 1 is not a tensor"
    assert borrow_blocker([torch.zeros(2), torch.zeros(2)], (0, 1)) == "input 0 is not a CUDA tensor"
    base = torch.zeros(8)
    other = torch.zeros(3)
    assert own_placeholder_inputs([base[:4], other, base[4:], base], (0, 1, 2, 3), ()) == {
        2: "inputs 0 and 2 share a storage",
        3: "inputs 0 and 3 share a storage",
    }
    weight = torch.zeros(4)
    assert own_placeholder_inputs([weight, weight[:2], other], (1, 2), (0,)) == {
        1: "input 1 shares a storage with static input 0"
    }


class _CopyingPlan(PlanDefaults):
    """A PI plan that serves input 0 and, from ``copy_from`` calls on, copies the inputs of ``uncover``
    (input 1 unless changed: an alignment fallback): ``update`` says so through ``uncovered_indices``."""

    def __init__(self, copy_from: int) -> None:
        self.calls = 0
        self.copy_from = copy_from
        self.uncover: tuple[int, ...] = (1,)
        self.rebased: list[dict[int, int]] = []
        self.uncovered_indices: tuple[int, ...] = ()

    def update(self, inputs: Any) -> bool:
        self.calls += 1
        self.uncovered_indices = self.uncover if self.calls >= self.copy_from else ()
        return True

    def rebase_placeholders(self, addresses: dict[int, int]) -> None:
        self.rebased.append(addresses)


def _borrowed_graph(
    plan: Any, capture_args: list[torch.Tensor], own_indices: frozenset[int] = frozenset()
) -> CapturedGraph:
    return fakes.captured_graph(
        CountingReplay(),
        placeholders=dict(enumerate(capture_args)),
        outputs=[torch.zeros(3)],
        output_container="single",
        static_ptrs=[None, None],
        pi_plan=plan,
        borrowed=True,
        own_indices=own_indices,
        count_outputs=False,
    )


def test_a_borrowed_graph_gets_its_own_placeholders_when_a_call_needs_a_copy() -> None:
    capture_args = [torch.zeros(3), torch.zeros(2, 3).t()]
    plan = _CopyingPlan(copy_from=2)
    graph = _borrowed_graph(plan, capture_args)
    first = [torch.ones(3), torch.ones(2, 3).t()]
    graph.run_with_pi(first, clone=False)
    assert graph.borrowed and graph.placeholders == {} and plan.rebased == []
    later = [torch.full((3,), 2.0), torch.full((2, 3), 5.0).t()]
    graph.run_with_pi(later, clone=False)
    assert not graph.borrowed and set(graph.placeholders) == {0, 1}
    (rebased,) = plan.rebased
    assert rebased == {i: p.data_ptr() for i, p in graph.placeholders.items()}
    assert graph.placeholders[1].stride() == later[1].stride()
    torch.testing.assert_close(graph.placeholders[1], later[1])  # the copy went to the new placeholder
    assert not capture_args[0].any() and not capture_args[1].any()  # never into the capturing inputs
    assert plan.calls == 3  # the update that found the copy ran again after the rebase


def _graph_with_outputs(outputs: list[Any], aliases: tuple[Any, ...] = ()) -> CapturedGraph:
    return fakes.captured_graph(
        None, placeholders={}, outputs=outputs, output_container="tuple", aliases=aliases
    )


def test_outputs_sharing_a_storage_are_one_held_storage_and_counted_once() -> None:
    """Note: [Outputs held within one call]: two outputs viewing one buffer give one weak reference whose
    own count is both tensors; a view of an input is not the pool's and is neither tracked nor aliased."""
    from grace.capture import OutputAlias

    base = torch.zeros(4, 4)
    rows, first = base[:2], base[0]
    x = torch.ones(3)
    viewing_x = OutputAlias(position=2, input_index=0, offset_delta=1)
    graph = _graph_with_outputs([rows, first, x[1:]], (viewing_x,))
    assert len(graph.output_refs) == 1 and graph.output_bytes == base.nbytes
    assert not graph.would_overwrite_held_outputs(1)  # a first replay in this call
    graph.last_generation = 1
    assert graph.would_overwrite_held_outputs(1)  # back in the same call: its own tensors were handed out
    graph.last_generation = 2
    assert not graph.would_overwrite_held_outputs(3)
    graph.last_generation = 3
    out = graph.collect_outputs([x], clone=False)  # aliases of the pool's outputs from now on
    assert out[0] is not rows and out[0].data_ptr() == rows.data_ptr() and out[1] is not first
    assert out[2].data_ptr() == x.data_ptr() + x.element_size()  # the input's view, rebuilt on the input
    assert graph.would_overwrite_held_outputs(3)  # ``out`` holds the pool's storage
    held = out[1].view(2, 2)
    del out
    assert graph.would_overwrite_held_outputs(3)  # a view of an alias still holds it
    del held
    assert not graph.would_overwrite_held_outputs(3)


def test_an_alias_is_a_new_tensor_of_the_outputs_memory_and_no_view_of_it() -> None:
    """What a replay hands out for a pool output: the same memory, sizes, strides, offset and version
    counter as the graph's own tensor, no view of it (``_base`` None, as a fresh tensor), and no
    requires-grad output is ever cut from autograd (that one stays a view)."""
    from grace.graph import _alias

    own = torch.arange(24.0).reshape(4, 6)[1:, ::2]
    alias = _alias(own)
    assert alias is not own and alias._base is None and not alias._is_view()
    assert (alias.data_ptr(), alias.size(), alias.stride()) == (own.data_ptr(), own.size(), own.stride())
    assert alias.storage_offset() == own.storage_offset()
    before = own._version
    alias.add_(1.0)
    assert own._version > before  # one version counter: autograd sees writes through either
    torch.testing.assert_close(own, alias)
    wants_grad = torch.ones(3, requires_grad=True)
    assert _alias(wants_grad).requires_grad


def test_clone_outputs_copies_the_pools_outputs_and_returns_views_of_inputs_as_views() -> None:
    """``clone_outputs`` promises the caller copies of what lives in the graph's pool; an output that
    views the caller's input (or a static input) is a view in eager, so it stays one: a later in-place
    write to the input shows in it, as in eager."""
    from grace.capture import OutputAlias, pool_positions

    pooled = torch.zeros(2, 2)
    x = torch.arange(6.0)
    weight = torch.ones(3)
    viewing_x = OutputAlias(position=1, input_index=0, offset_delta=2)
    outputs = [pooled, x[2:], weight]
    graph = _graph_with_outputs(outputs, (viewing_x,))
    graph.pool_positions = pool_positions(outputs, (viewing_x,), graph.device, [x, weight], (1,))
    assert graph.pool_positions == {0}
    out = graph.collect_outputs([x, weight], clone=True)
    assert out[0] is not pooled and out[0].data_ptr() != pooled.data_ptr()
    x[3] = 42.0
    assert out[1][1] == 42.0 and out[1].data_ptr() == x.data_ptr() + 2 * x.element_size()
    assert out[2] is weight
    graph.pool_positions = None  # not given: every output on the device but the views of inputs
    out = graph.collect_outputs([x, weight], clone=True)
    assert out[1].data_ptr() == x.data_ptr() + 2 * x.element_size() and out[2] is not weight


def test_a_graph_borrowing_some_inputs_keeps_placeholders_for_the_rest_only() -> None:
    """Two inputs viewing one tensor: the first is read in place, the second from a placeholder of the
    graph's own; a call that copies the second uses its placeholder and makes none for the first (PI
    serves it); a call that copies the first gives it a placeholder, and the plan is pointed at that one
    alone; a graph PI serves wholly drops every placeholder and keeps layouts."""
    shared = torch.zeros(6)
    own = torch.zeros(3)  # the placeholder of input 1 (it views input 0's storage)
    capture_args = [shared[:3], own]
    plan = _CopyingPlan(copy_from=2)
    graph = _borrowed_graph(plan, capture_args, own_indices=frozenset({1}))
    assert graph.borrowed and set(graph.placeholders) == {1} and graph.placeholders[1] is own
    first = [torch.ones(6)[:3], torch.ones(6)[3:]]
    graph.run_with_pi(first, clone=False)
    assert plan.rebased == [] and set(graph.placeholders) == {1}
    later = [torch.full((6,), 2.0)[:3], torch.full((6,), 5.0)[3:]]
    graph.run_with_pi(later, clone=False)
    assert plan.rebased == [] and set(graph.placeholders) == {1} and graph.borrowed
    torch.testing.assert_close(own, later[1])  # input 1 (uncovered) copied into its own placeholder
    plan.uncover = (0, 1)
    graph.run_with_pi(later, clone=False)
    (rebased,) = plan.rebased
    assert set(rebased) == {0} and rebased[0] == graph.placeholders[0].data_ptr()  # the new one alone
    assert graph.placeholders[1] is own and not graph.borrowed
    torch.testing.assert_close(own, later[1])  # input 1 (uncovered) copied into its own placeholder
    assert not shared.any()  # never into the capturing inputs
    graph.forget_placeholders()
    assert graph.placeholders == {} and graph.borrowed and set(graph.bindings.layouts) == {0, 1}
