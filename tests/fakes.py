"""Shared stand-ins for the runtime's CUDA parts, so that the runner, the deciding call and the graph
bookkeeping can be tested on CPU.

- ``captured_graph``: a real ``CapturedGraph`` around a stand-in CUDA graph (anything with ``replay``
  and, optionally, ``reset``), built through the public constructor as a capture would build it;
- stand-in CUDA graphs: ``WritesOutput`` (writes twice its placeholder into its output),
  ``ReplaysCallable`` (replays a callable on what the captured graph reads), ``LoggedGraph`` (logs its
  replays and resets), ``CountingReplay``;
- ``fake_capture``: stands for ``grace.capture.capture_graph`` (a real ``CapturedGraph`` replaying the
  callable on its placeholders);
- stand-ins of a whole ``CapturedGraph`` for the slot alone: ``SlotGraph`` and its subclasses;
- stand-ins of the deciding call and of a rebind: ``decides_no_graph``, ``decides_graph``,
  ``no_rebind``; ``cpu_warmup`` runs warm-up calls in place of grace's side stream.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import torch

import grace.decide
import grace.slot
from grace.capture import CapturedGraph, HeldState, OutputAlias, placeholders_for
from grace.decide import Rebound, SlotDecision
from grace.runplan import SlotFacts
from grace.scg import Variant

CPU = torch.device("cpu")


def captured_graph(
    replay: Any,
    *,
    placeholders: Mapping[int, torch.Tensor],
    outputs: list[Any],
    device: torch.device = CPU,
    output_container: str = "list",
    static_indices: tuple[int, ...] = (),
    static_ptrs: list[int | None] | None = None,
    mutated_indices: tuple[int, ...] = (),
    copy_indices: tuple[int, ...] | None = None,
    aliases: tuple[OutputAlias, ...] = (),
    borrowed: bool = False,
    own_indices: frozenset[int] = frozenset(),
    layouts: Mapping[int, tuple[torch.Size, tuple[int, ...], torch.dtype]] | None = None,
    pi_plan: Any = None,
    origin: CapturedGraph | None = None,
    count_outputs: bool = True,
    kept_from: int | None = None,
) -> CapturedGraph:
    """A ``CapturedGraph`` replaying through ``replay``; ``count_outputs``: the outputs count as held in
    its pool (weak references and bytes, as a capture records them; a rebound graph counts none);
    ``kept_from``: Note: [Outputs autograd keeps] (None: an inference graph)."""
    return CapturedGraph.assemble(
        graph=replay,
        device=device,
        placeholders=dict(placeholders),
        copy_indices=tuple(sorted(placeholders)) if copy_indices is None else copy_indices,
        mutated_indices=mutated_indices,
        outputs=outputs,
        output_container=output_container,
        aliases=aliases,
        static_indices=static_indices,
        static_ptrs=static_ptrs if static_ptrs is not None else [],
        borrowed=borrowed,
        own_indices=own_indices,
        layouts=layouts,
        pi_plan=pi_plan,
        origin=origin,
        count_outputs=count_outputs and origin is None,
        kept_from=kept_from,
    )


class WritesOutput:
    """A stand-in CUDA graph: each replay writes twice the captured input into the output."""

    def __init__(self, out: torch.Tensor, x: torch.Tensor) -> None:
        self.out, self.x = out, x

    def replay(self) -> None:
        self.out.copy_(self.x * 2)


class LoggedGraph:
    """A stand-in CUDA graph that logs its replays and resets."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def replay(self) -> None:
        self.log.append(f"replay {self.name}")

    def reset(self) -> None:
        self.log.append(f"reset {self.name}")


class CountingReplay:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


class ReplaysCallable:
    """A stand-in CUDA graph that replays ``fn`` on what the captured graph reads (its placeholders, or
    with ``table_of``, what a PI plan's table points at) into the captured outputs."""

    def __init__(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        table_of: Callable[[CapturedGraph], Mapping[int, torch.Tensor] | None] | None = None,
    ) -> None:
        self.fn = fn
        self.args = list(args)
        self.owner: CapturedGraph | None = None
        self.table_of = table_of
        self.replays = 0

    def replay(self) -> None:
        owner = self.owner
        assert owner is not None
        table = self.table_of(owner) if self.table_of is not None else None
        reads = owner.placeholders if table is None else table
        inputs = [reads.get(i, a) for i, a in enumerate(self.args)]
        result = self.fn(*inputs)
        outs = list(result) if isinstance(result, (list, tuple)) else [result]
        for static, value in zip(owner.outputs, outs, strict=True):
            static.copy_(value)
        self.replays += 1

    def reset(self) -> None:
        pass


def fake_capture(
    fn: Any,
    args: Sequence[Any],
    *,
    device: torch.device,
    dynamic_indices: Sequence[int],
    static_indices: Sequence[int],
    mutated_indices: Sequence[int],
    hooks: Sequence[Any] = (),
    placeholders: Mapping[int, torch.Tensor] | None = None,
    borrow_inputs: bool = False,
    keep_pristine: bool = False,
    kept_from: int | None = None,
    pool_group: Any = None,
    pool_kin: Any = None,
) -> CapturedGraph:
    """A capture runs nothing (kernels are recorded, not executed): the outputs' layouts come from a run
    on clones of the inputs, with the generators as they were."""
    held = placeholders_for(args, dynamic_indices, placeholders)
    state = torch.get_rng_state()
    clones = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    result = fn(*clones)
    torch.set_rng_state(state)
    outs = list(result) if isinstance(result, (list, tuple)) else [result]
    graph = ReplaysCallable(fn, args)
    captured = captured_graph(
        graph,
        placeholders=held,
        mutated_indices=tuple(i for i in mutated_indices if i in held),
        outputs=[torch.empty_like(o) for o in outs],
        output_container="tuple"
        if isinstance(result, tuple)
        else "list"
        if isinstance(result, list)
        else "single",
        static_indices=tuple(static_indices),
        static_ptrs=[a.data_ptr() if i in static_indices else None for i, a in enumerate(args)],
        count_outputs=False,
    )
    graph.owner = captured
    if pool_group is not None:
        captured.join_pool_group(pool_group, pool_kin, None)
    return captured


class SlotGraph:
    """What a slot needs of a ``CapturedGraph``: static addresses, copy counts, a held-output state that
    is never held (Note: [Outputs held within one call] is tested on a real ``CapturedGraph``), a
    release. Subclasses say how a replay computes."""

    def __init__(self, args: Sequence[Any], static_indices: tuple[int, ...] = ()) -> None:
        self.static_indices = static_indices
        self.static_ptrs = [a.data_ptr() if i in static_indices else None for i, a in enumerate(args)]
        self.pi_plan: Any = None
        self.copy_bytes = 0
        self.copy_indices: tuple[int, ...] = ()
        self.mutated_indices: tuple[int, ...] = ()
        self.output_bytes = 0
        self.shares_outputs = False
        self.origin = None
        self.shared_pool = None

    def held_outputs(self, generation: int, args: Sequence[Any] | None = None) -> HeldState:
        return HeldState.NONE

    def note_replay(self, generation: int) -> None:
        pass

    def static_inputs_unmoved(self, args: Sequence[Any]) -> bool:
        return all(args[i].data_ptr() == self.static_ptrs[i] for i in self.static_indices)

    def release(self) -> None:
        pass


def decides_no_graph(facts: SlotFacts, args: Sequence[Any]) -> SlotDecision:
    """A deciding call that keeps no graph (no reason: none is recorded)."""
    return SlotDecision(Variant.NO_GRAPH)


def decides_graph(
    make: Callable[[SlotFacts, Sequence[Any]], Any], variant: Variant = Variant.GRAPH_COPIES
) -> Callable[[SlotFacts, Sequence[Any]], SlotDecision]:
    """A deciding call that binds the graph ``make`` builds, with no check and no safety net."""

    def decide(facts: SlotFacts, args: Sequence[Any]) -> SlotDecision:
        return SlotDecision.bind(variant, make(facts, args))

    return decide


def no_rebind(facts: SlotFacts, graph: Any, variant: Variant, args: Sequence[Any]) -> Rebound:
    return Rebound(None)


def cpu_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm-up calls run in place (no side stream on CPU)."""
    monkeypatch.setattr(grace.slot, "run_on_side_stream", lambda fn, args, device: fn(*args))


def use_decide(monkeypatch: pytest.MonkeyPatch, decide: Callable[[SlotFacts, Sequence[Any]], Any]) -> None:
    monkeypatch.setattr(grace.decide, "decide", decide)


def use_rebind(monkeypatch: pytest.MonkeyPatch, rebind: Callable[..., Rebound]) -> None:
    monkeypatch.setattr(grace.decide, "rebind_graph", rebind)


def step_runners(
    monkeypatch: pytest.MonkeyPatch, capture: Callable[[SlotFacts, Sequence[Any]], Any], generation: list[int]
) -> tuple[Any, Any]:
    """A training step's forward (returns ``x * 2`` to the caller and saves ``x + 1``) and backward (two
    gradients, ``g * 2`` and ``g + 1``) runners with option ``step_pool``, over ``capture``'s fake
    graphs, in compiled call ``generation[0]``."""
    from grace.compat.aot import GraphRole
    from grace.options import GraceOptions
    from grace.runner import GraceRunner, RunnerPlan

    cpu_warmup(monkeypatch)
    use_decide(monkeypatch, decides_graph(capture))
    monkeypatch.setattr(grace.slot.torch_compat, "compiled_call_generation", lambda: generation[0])
    options = GraceOptions(step_pool=True)

    def runner(role: GraphRole, kept_from: int) -> GraceRunner:
        indices: dict[str, Any] = {"static_indices": (), "dynamic_indices": (0,), "scalar_indices": ()}
        plan = RunnerPlan("h", CPU, **indices, role=role, kept_from=kept_from)
        return GraceRunner(lambda x: [x * 2, x + 1], plan, options, None)

    return runner(GraphRole.FORWARD, 1), runner(GraphRole.BACKWARD, 0)
