"""A captured, instantiated CUDA graph with its bindings: replay it, with input copies or with PI.

Problem: a replay must read the call's inputs (copied into placeholders, or pointed at by PI's table),
read the static inputs where they were at capture, write outputs no one still holds, keep the stream
order of the graph's family, and release the pool only when nothing reads it any more.

Design: ``CapturedGraph`` holds the executable graph and its bindings (placeholders, own or borrowed
from the caller's inputs; static-input addresses; the PI plan), its outputs and their held state
(grace.outputs; the state of a family of rebound graphs lives with the captured graph,
``outputs_owner``), and the pristine copy grace.rebind edits. ``assemble`` builds one from what a
capture found, ``rebound_from`` one of a family (grace.rebind). Outputs that are views of a
placeholder are rebuilt as views of the caller's real input on each replay.

Invariants:
- ``run_with_copies``/``run_with_pi`` copy every dynamic input the graph reads through a placeholder
  before the replay and copy mutated dynamic inputs back after it;
- a graph captured on the caller's own inputs (option ``pi_direct``) keeps no reference to them: it has
  no placeholders until a call needs one (``own_placeholders``), and nothing is ever copied into an
  input of the capturing call;
- the pool of a captured graph lives until the last graph of its family is released, whichever that
  is, and then for as long as any output of it is held (grace.pools); the pristine copy goes with it;
- every use of a graph's placeholders, pointer table, pool and outputs is queued after all work queued
  so far on the stream of the previous use (Note: [Stream order] in grace.streams);
- the outputs a call from one thread received are never overwritten by a replay for another thread
  while they are held (Note: [Outputs and threads] in grace.outputs).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grace import poolgroups, pools, streams
from grace.compat import cuda as cuda_compat
from grace.compat import torch as torch_compat
from grace.cudagraph import GraphSummary
from grace.outputs import (
    HeldState,
    OutputAlias,
    OutputFamily,
    _pool_outputs_all,
    data_in_spans,
    pool_output_bytes,
    pool_storage_spans,
)
from grace.pi_contract import PIPlan
from grace.placeholders import Bindings, Layout, StorageSpan, static_pointers, storage_spans

logger = logging.getLogger(__name__)


@dataclass
class PristineCopy:
    """What grace.rebind starts from: the captured graph before any hook edited it (a ``cuGraph_t`` the
    family's pool release destroys; None for a rebound graph or where this torch keeps no captured
    graph), the spans of the static inputs, and what the capture read for each dynamic input
    (placeholders or, borrowed, the caller's inputs)."""

    handle: int | None = None
    static_spans: dict[int, StorageSpan] = field(default_factory=dict)
    capture_spans: dict[int, StorageSpan] = field(default_factory=dict)


@dataclass
class CapturedGraph:
    """An instantiated graph with its bindings, its outputs and their family, and its pristine copy.

    ``outputs``: what the compiled callable returned, as a list (``output_container``: ``"tuple"``,
    ``"list"`` or ``"single"``); ``pool_positions``: the outputs the graph wrote in its pool, the only ones
    ``clone_outputs`` copies and replays hand out as aliases (None: every output on the device but the
    views of dynamic inputs); ``output_bytes``: the bytes of their storages this graph counts as held (a
    rebound graph counts none: they are its origin's). ``family`` is read on ``outputs_owner``."""

    graph: Any
    device: torch.device
    bindings: Bindings
    outputs: list[Any]
    output_container: str
    aliases: tuple[OutputAlias, ...]
    summary: GraphSummary | None = None
    summary_error: str | None = None
    pi_plan: PIPlan | None = None
    pool_positions: frozenset[int] | None = None
    output_bytes: int = 0
    family: OutputFamily = field(default_factory=OutputFamily)
    rebinding: PristineCopy = field(default_factory=PristineCopy)
    origin: CapturedGraph | None = None  # the captured graph this one was rebound from
    _output_spans: tuple[tuple[int, int], ...] | None = None
    _outputs_need_grad: bool = False  # an output in the pool requires grad (never, but then: _alias)
    pool_group: poolgroups.PoolGroup | None = None  # Note: [Graphs in one pool] in grace.poolgroups

    @classmethod
    def assemble(
        cls,
        *,
        graph: Any,
        device: torch.device,
        placeholders: Mapping[int, torch.Tensor],
        copy_indices: tuple[int, ...],
        mutated_indices: tuple[int, ...],
        outputs: list[Any],
        output_container: str,
        aliases: tuple[OutputAlias, ...],
        static_indices: tuple[int, ...],
        static_ptrs: list[int | None],
        borrowed: bool = False,
        own_indices: frozenset[int] = frozenset(),
        layouts: Mapping[int, Layout] | None = None,
        pi_plan: PIPlan | None = None,
        origin: CapturedGraph | None = None,
        count_outputs: bool = True,
        pool_positions: frozenset[int] | None = None,
        copy_bytes: int = 0,
        pristine: int | None = None,
        static_spans: Mapping[int, StorageSpan] | None = None,
        capture_spans: Mapping[int, StorageSpan] | None = None,
        kept_from: int | None = None,
    ) -> CapturedGraph:
        """A graph from what its capture (or rebind) found.

        ``placeholders``: what the graph reads for each dynamic input (``Bindings.of``; a ``borrowed``
        graph keeps only the layouts of those not in ``own_indices``). ``count_outputs``: the outputs
        live in this graph's pool and count as held by it (a graph rebound from ``origin`` writes the
        origin's and counts none).
        ``kept_from``: Note: [Outputs autograd keeps] in grace.outputs (None: an inference graph)."""
        bindings = Bindings.of(
            placeholders,
            copy_indices=copy_indices,
            mutated_indices=mutated_indices,
            static_indices=static_indices,
            static_ptrs=static_ptrs,
            copy_bytes=copy_bytes,
            borrowed=borrowed,
            own_indices=own_indices,
            layouts=layouts,
        )
        return cls(
            graph=graph,
            device=device,
            bindings=bindings,
            outputs=outputs,
            output_container=output_container,
            aliases=aliases,
            pi_plan=pi_plan,
            pool_positions=pool_positions,
            output_bytes=pool_output_bytes(outputs, aliases, device) if count_outputs else 0,
            family=OutputFamily.of(outputs, aliases, device, kept_from) if count_outputs else OutputFamily(),
            rebinding=PristineCopy(pristine, dict(static_spans or {}), dict(capture_spans or {})),
            origin=origin,
            _outputs_need_grad=any(isinstance(o, torch.Tensor) and o.requires_grad for o in outputs),
        )

    @classmethod
    def rebound_from(cls, origin: CapturedGraph, graph: Any, args: Sequence[Any]) -> CapturedGraph:
        """A graph of ``origin``'s family (grace.rebind): ``graph`` reads the static inputs where ``args``
        has them and, like ``origin``, its placeholders (a graph captured on the caller's inputs gets
        placeholders of its own when a call needs a copy), and writes ``origin``'s pool and outputs."""
        own = origin.bindings
        origin.family.sharers += 1
        rebound = cls.assemble(
            graph=graph,
            device=origin.device,
            placeholders=dict(own.placeholders),
            copy_indices=own.copy_indices,
            mutated_indices=own.mutated_indices,
            outputs=origin.outputs,  # one list for the family (Note: [Outputs and threads])
            output_container=origin.output_container,
            aliases=origin.aliases,
            pool_positions=origin.pool_positions,
            static_indices=own.static_indices,
            static_ptrs=static_pointers(args, own.static_indices),
            copy_bytes=own.copy_bytes,
            layouts=own.layouts,
            static_spans=storage_spans(args, own.static_indices),
            capture_spans=origin.rebinding.capture_spans,
            origin=origin,
            count_outputs=False,  # the origin's outputs: counted once, with the origin
        )
        rebound.summary = origin.summary
        return rebound

    # --- what the bindings, the family and the pristine copy hold, by their old names ---------------

    @property
    def placeholders(self) -> dict[int, torch.Tensor]:
        return self.bindings.placeholders

    @property
    def copy_indices(self) -> tuple[int, ...]:
        return self.bindings.copy_indices

    @property
    def mutated_indices(self) -> tuple[int, ...]:
        return self.bindings.mutated_indices

    @property
    def static_indices(self) -> tuple[int, ...]:
        return self.bindings.static_indices

    @property
    def static_ptrs(self) -> list[int | None]:
        return self.bindings.static_ptrs

    @property
    def copy_bytes(self) -> int:
        return self.bindings.copy_bytes

    @property
    def borrowed(self) -> bool:
        return self.bindings.borrowed

    @property
    def output_refs(self) -> list[tuple[Any, int]]:
        return self.family.refs

    @property
    def last_generation(self) -> int | None:
        return self.family.last_generation

    @last_generation.setter
    def last_generation(self, value: int | None) -> None:
        self.family.last_generation = value

    @property
    def last_stream(self) -> Any:
        return self.family.last_stream

    @property
    def threads_shared(self) -> bool:
        return self.family.threads_shared

    @property
    def sharers(self) -> int:
        return self.family.sharers

    @sharers.setter
    def sharers(self, value: int) -> None:
        self.family.sharers = value

    @property
    def pristine(self) -> int | None:
        return self.rebinding.handle

    @property
    def static_spans(self) -> dict[int, StorageSpan]:
        return self.rebinding.static_spans

    @property
    def capture_spans(self) -> dict[int, StorageSpan]:
        return self.rebinding.capture_spans

    # --- replay -------------------------------------------------------------------------------

    def forget_placeholders(self, keep: Collection[int] = ()) -> None:
        """Drop the placeholders but those of ``keep`` (``Bindings.forget_placeholders``)."""
        self.bindings.forget_placeholders(keep)

    def own_placeholders(self) -> dict[int, int]:
        """Give a graph captured on the caller's inputs placeholders of its own; returns their addresses."""
        return self.bindings.own_placeholders(self.device)

    def static_inputs_unmoved(self, args: Sequence[Any]) -> bool:
        bindings = self.bindings
        return torch_compat.data_ptrs_equal(args, bindings.static_ptrs, bindings.static_indices)

    def copy_in(self, args: Sequence[Any], indices: Sequence[int]) -> None:
        self.bindings.copy_in(args, indices)

    def copy_back(self, args: Sequence[Any], indices: Sequence[int]) -> None:
        self.bindings.copy_back(args, indices)

    def order_streams(self) -> None:
        """Queue what follows on the current stream after all work queued so far on the stream of the
        previous run of this graph or its family (Note: [Stream order] in grace.streams)."""
        owner = self.outputs_owner
        order: OutputFamily | poolgroups.PoolGroup = owner.pool_group or owner.family  # a group: one order
        key = streams.current_stream_key(self.device)
        if key == order.last_stream_key:
            return  # the same stream (or no streams): in order already
        stream = streams.current_stream(self.device)
        last = order.last_stream
        if last is not None:
            stream.wait_stream(last)
            streams.synchronize_device(self.device)  # reads queued on streams grace never saw are done too
        order.last_stream, order.last_stream_key = stream, key

    def replay(self) -> None:
        """One replay on the current stream (``run_with_copies``/``run_with_pi`` order it first)."""
        self.graph.replay()

    def run_with_copies(self, args: Sequence[Any], clone: bool, ordered: bool = False) -> Any:
        """Graph with input copies: what PyTorch2-CG does on each call (``ordered``: streams checked)."""
        if not ordered:
            self.order_streams()
        self.copy_in(args, self.copy_indices)
        self.replay()
        self.copy_back(args, self.mutated_indices)
        return self.collect_outputs(args, clone)

    def run_with_pi(self, args: Sequence[Any], clone: bool, ordered: bool = False) -> Any:
        plan = self.pi_plan
        assert plan is not None
        if not ordered:  # before the table update: a replay in flight elsewhere may still read it
            self.order_streams()
        copied = plan.uncovered_indices if plan.update(args) else self.copy_indices
        if copied and self.bindings.lacks_placeholder(copied):
            plan.rebase_placeholders(self.own_placeholders())
            copied = plan.uncovered_indices if plan.update(args) else self.copy_indices
        if copied:  # (an empty copy still costs a dispatch)
            self.copy_in(args, copied)
        self.replay()
        if self.mutated_indices:
            self.copy_back(args, [i for i in self.mutated_indices if i in copied])
        return self.collect_outputs(args, clone)

    # --- outputs and their family ---------------------------------------------------------------

    @property
    def outputs_owner(self) -> CapturedGraph:
        """The graph whose outputs this one writes: itself, or the graph it was rebound from."""
        return self.origin if self.origin is not None else self

    @property
    def shares_outputs(self) -> bool:
        """Whether another graph (grace.rebind) writes this graph's outputs too."""
        return self.origin is not None or self.family.sharers > 0

    def would_overwrite_held_outputs(self, generation: int) -> bool:
        """Whether replaying now, in compiled call ``generation``, could overwrite outputs of the last
        replay of this graph, or of a graph sharing its outputs, that something still holds (Note:
        [Outputs held within one call] in grace.outputs)."""
        return self.held_outputs(generation) is not HeldState.NONE

    def held_outputs(self, generation: int, args: Sequence[Any] | None = None) -> HeldState:
        return self.why_held(generation, args)[0]

    def why_held(self, generation: int, args: Sequence[Any] | None = None) -> tuple[HeldState, str | None]:
        """Whether a replay now, in compiled call ``generation`` (on ``args``), would overwrite held outputs,
        and why (None: it would not): its own (the kept ones first: when held, nothing else changes the
        answer), or a pool member's (``PoolGroup.overwritten_held_by``: without ``args``, every held one)."""
        owner = self.outputs_owner
        family = owner.family
        if family.needs_sharing():
            self.share_across_threads()
        if family.kept and family.kept_held():
            return HeldState.HELD, "outputs autograd keeps"
        group = owner.pool_group
        if group is not None and (other := group.overwritten_held_by(owner, generation, args)) is not None:
            return HeldState.HELD, f"an output of {other} it would overwrite"
        state = family.held(generation)
        return state, None if state is HeldState.NONE else f"outputs {state.value} in this call"

    @property
    def shared_pool(self) -> poolgroups.PoolGroup | None:
        """The group of graphs whose pool this graph's outputs live in (Note: [Graphs in one pool] in
        grace.poolgroups), or None for a pool of its own."""
        return self.outputs_owner.pool_group

    def pool_group_for_sets(self, kin: object) -> poolgroups.PoolGroup:
        """The group further output sets of this graph (serving callable ``kin``) are captured into: its
        own, or one made with this graph first, its footprint the whole pool now (grace.poolgroups)."""
        owner = self.outputs_owner
        if owner.pool_group is None:
            owner.pool_group = poolgroups.PoolGroup.around(owner, torch_compat.graph_pool(owner.graph), kin)
        return owner.pool_group

    def join_pool_group(
        self, group: poolgroups.PoolGroup, kin: object, footprint: poolgroups.Spans | None
    ) -> None:
        """Captured into ``group``'s pool after its members, serving callable ``kin`` (grace.poolgroups)."""
        self.pool_group = group
        group.join(self, kin=kin, footprint=footprint, storages=self.pool_storage_spans())

    def share_across_threads(self) -> None:
        """Note: [Outputs and threads] in grace.outputs (``OutputFamily.share``)."""
        self.outputs_owner.family.share(self.outputs, self.aliases, self.device)

    def last_replayed_by_another(self) -> bool:
        """Whether the last replay that wrote these outputs was another graph's (one rebound from the
        same capture)."""
        return self.outputs_owner.family.last_writer not in (None, id(self))

    def output_spans(self) -> tuple[tuple[int, int], ...]:
        """The address ranges of the storages of this graph's outputs in its pool (``pool_positions``:
        no parameter a forward returns for its backward, no view of an input), sorted and merged."""
        if self._output_spans is None:
            self._output_spans = poolgroups.merged(self.pool_storage_spans())
        return self._output_spans

    def pool_storage_spans(self) -> tuple[tuple[int, int], ...]:
        """Per storage of the outputs' family (``family.refs``' order), its range in the pool (empty where
        none of ``output_spans``)."""
        return pool_storage_spans(self.outputs, self.aliases, self.device, self.pool_positions)

    def outputs_read_by(self, args: Sequence[Any], indices: Sequence[int]) -> bool:
        """Whether an input at ``indices`` lies in the storage of one of this graph's outputs in its pool:
        a layer's result handed to the next layer's piece (the outputs of a graph rebound from the same
        capture share those storages, grace.rebind)."""
        return data_in_spans(args, indices, self.output_spans())

    def note_replay(self, generation: int) -> None:
        self.outputs_owner.family.note_replay(generation, id(self))

    def collect_outputs(self, args: Sequence[Any], clone: bool) -> Any:
        outs = list(self.outputs)
        pooled = self.pool_positions
        if pooled is None:
            pooled = self.pool_positions = frozenset(_pool_outputs_all(outs, self.aliases, self.device))
        if clone:
            outs = [o.clone() if i in pooled else o for i, o in enumerate(outs)]
        elif self.outputs_owner.family.hands_out_aliases:
            if len(pooled) == len(outs) and not self._outputs_need_grad:
                outs = [o.detach() for o in outs]  # _alias, without a frame per output
            else:
                outs = [_alias(o) if i in pooled else o for i, o in enumerate(outs)]
        for alias in self.aliases:
            real = args[alias.input_index]
            static = outs[alias.position]
            outs[alias.position] = real.as_strided(
                static.size(), static.stride(), real.storage_offset() + alias.offset_delta
            )
        if self.output_container == "tuple":
            return tuple(outs)
        return outs[0] if self.output_container == "single" else outs

    # --- release ------------------------------------------------------------------------------

    def release(self) -> None:
        """Drop the graph, its placeholders and static outputs; the pool is freed with the last of them.

        Graphs rebound from this one (grace.rebind) replay in its pool: the pool is released with the
        last graph of the family, whichever is released last, and then only once no output of it is held
        (grace.pools). Releasing a graph a second time does nothing."""
        if self.pi_plan is not None:
            try:
                self.pi_plan.release()
            except Exception:  # releasing must not raise out of reset or GC
                logger.debug("grace: PI plan release failed", exc_info=True)
        self.pi_plan = None
        self.outputs = []  # first: what the caller holds is what keeps the pool (grace.pools)
        self.bindings.drop()
        origin, self.origin = self.origin, None
        if origin is not None:
            _reset(self.graph)  # the rebound executable graph; the pool is the origin's
            family = origin.family
            family.sharers -= 1
            if family.sharers == 0 and family.release_pending:
                origin._release_pool()
        elif self.family.sharers:
            self.family.release_pending = True
        else:
            self._release_pool()

    def _release_pool(self) -> None:
        family = self.family
        family.release_pending = False
        if family.released:
            return
        family.released = True
        graph, pristine, group = self.graph, self.rebinding.handle, self.pool_group
        self.rebinding.handle = None

        def release_pool() -> None:
            _reset(graph)
            _destroy(pristine)
            if group is not None:  # its outputs are dead: no other member's replay need spare them
                group.leave(self)

        pools.release_when_unheld(family.all_refs(), release_pool)


def _alias(output: torch.Tensor) -> torch.Tensor:
    """A new tensor over an output's memory, handed out instead of the graph's own (Note: [Outputs held
    within one call] in grace.outputs): ``detach`` makes it in one step, with the same sizes, strides,
    offset and version counter, and no view of the graph's tensor (so autograd's rules for views made
    inside a Function do not apply to it, as they do not to a fresh tensor). A pool output never
    requires grad; one that would keeps a view, so that nothing is cut from autograd."""
    if output.requires_grad:
        return output.as_strided(output.size(), output.stride(), output.storage_offset())
    return output.detach()


def _reset(graph: Any) -> None:
    try:
        graph.reset()
    except Exception:
        logger.debug("grace: CUDAGraph.reset failed", exc_info=True)
    pools.mark_hand_back_due()  # its pool's segments stay reserved until handed back (grace.pools)


def _destroy(pristine: int | None) -> None:
    if pristine:
        try:
            cuda_compat.graph_destroy(pristine)
        except Exception:
            logger.debug("grace: destroying the pristine graph failed", exc_info=True)
