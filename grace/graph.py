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
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grace import pools, streams
from grace.compat import cuda as cuda_compat
from grace.compat import torch as torch_compat
from grace.cudagraph import GraphSummary
from grace.outputs import (
    HeldState,
    OutputAlias,
    _pool_outputs,
    _pool_outputs_all,
    _storage_ptr,
    output_refs,
    pool_output_bytes,
)
from grace.placeholders import StorageSpan, dense_view, static_pointers, storage_spans
from grace.seam import PIPlan

logger = logging.getLogger(__name__)


@dataclass
class CapturedGraph:
    """An instantiated graph with its placeholders and static outputs."""

    graph: Any
    device: torch.device
    placeholders: dict[int, torch.Tensor]
    copy_indices: tuple[int, ...]
    mutated_indices: tuple[int, ...]
    outputs: list[Any]
    output_container: str  # "tuple", "list" or "single": what the compiled callable returned
    aliases: tuple[OutputAlias, ...]
    static_indices: tuple[int, ...]
    static_ptrs: list[int | None]
    summary: GraphSummary | None
    summary_error: str | None = None
    copy_bytes: int = 0
    pi_plan: PIPlan | None = None
    # Outputs the graph wrote in its pool: the only ones ``clone_outputs`` copies and replays hand out as
    # aliases (views of the caller's inputs and of static inputs are returned as views, as eager does);
    # None: every output on the device but the views of dynamic inputs.
    pool_positions: frozenset[int] | None = None
    _dense_placeholders: dict[int, torch.Tensor] = field(default_factory=dict)
    # Captured on the caller's inputs: no placeholders yet; the layouts to make them from when needed.
    borrowed: bool = False
    _layouts: dict[int, tuple[torch.Size, tuple[int, ...], torch.dtype]] = field(default_factory=dict)
    # Note: [Outputs held within one call]: weak references to the outputs' storages in the graph's pool,
    # each with the use count the graph's own tensors give it; the compiled call of the last replay through
    # the runner; the call from which replays hand out aliases of the outputs (None: the outputs).
    output_refs: list[tuple[Any, int]] = field(default_factory=list)
    output_bytes: int = 0  # bytes of the outputs' storages in the graph's pool, held as long as the graph
    last_generation: int | None = None
    aliases_since: int | None = None
    last_writer: int | None = None  # id() of the graph whose replay wrote the outputs last
    last_stream: Any = None  # the stream of the family's last run (Note: [Stream order]) and its handle
    last_stream_key: int | None = None
    # Note: [Outputs and threads]: the thread whose call the last replay served; whether the outputs have
    # served several threads (then every replay needs them all dropped).
    last_thread: int | None = None
    threads_shared: bool = False
    # grace.rebind: the captured graph before any hook edited it (a cuGraph_t this object destroys), the
    # spans of the static inputs and of what the capture read for each dynamic input (placeholders or,
    # borrowed, the caller's inputs); a graph rebound from another has that one as ``origin`` and shares
    # its pool, placeholders, outputs and held-output state; ``sharers`` counts those of an origin.
    pristine: int | None = None
    static_spans: dict[int, StorageSpan] = field(default_factory=dict)
    capture_spans: dict[int, StorageSpan] = field(default_factory=dict)
    origin: CapturedGraph | None = None
    sharers: int = 0
    _pool_release_pending: bool = False
    _pool_released: bool = False
    _output_spans: list[tuple[int, int]] | None = None

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
        layouts: Mapping[int, tuple[torch.Size, tuple[int, ...], torch.dtype]] | None = None,
        pi_plan: PIPlan | None = None,
        origin: CapturedGraph | None = None,
        count_outputs: bool = True,
        pool_positions: frozenset[int] | None = None,
        copy_bytes: int = 0,
        pristine: int | None = None,
        static_spans: Mapping[int, StorageSpan] | None = None,
        capture_spans: Mapping[int, StorageSpan] | None = None,
    ) -> CapturedGraph:
        """A graph from what its capture (or rebind) found.

        ``placeholders``: what the graph reads for each dynamic input; a ``borrowed`` graph read the
        caller's inputs and keeps none of them, only their ``layouts`` (taken from ``placeholders`` when
        not given). ``count_outputs``: the outputs live in this graph's pool and count as held by it (a
        graph rebound from ``origin`` writes the origin's and counts none)."""
        if borrowed and layouts is None:
            layouts = {i: (p.size(), tuple(p.stride()), p.dtype) for i, p in placeholders.items()}
        kept = {} if borrowed else dict(placeholders)
        return cls(
            graph=graph,
            device=device,
            placeholders=kept,
            copy_indices=copy_indices,
            mutated_indices=mutated_indices,
            outputs=outputs,
            output_container=output_container,
            aliases=aliases,
            static_indices=static_indices,
            static_ptrs=static_ptrs,
            summary=None,
            copy_bytes=copy_bytes,
            pi_plan=pi_plan,
            pool_positions=pool_positions,
            _dense_placeholders={i: dense_view(p) for i, p in kept.items()},
            borrowed=borrowed,
            _layouts=dict(layouts) if borrowed and layouts is not None else {},
            output_refs=output_refs(outputs, aliases, device) if count_outputs else [],
            output_bytes=pool_output_bytes(outputs, aliases, device) if count_outputs else 0,
            pristine=pristine,
            static_spans=dict(static_spans or {}),
            capture_spans=dict(capture_spans or {}),
            origin=origin,
        )

    @classmethod
    def rebound_from(cls, origin: CapturedGraph, graph: Any, args: Sequence[Any]) -> CapturedGraph:
        """A graph of ``origin``'s family (grace.rebind): ``graph`` reads the static inputs where ``args``
        has them and, like ``origin``, its placeholders (a graph captured on the caller's inputs gets
        placeholders of its own when a call needs a copy), and writes ``origin``'s pool and outputs."""
        borrowed = bool(origin._layouts)
        origin.sharers += 1
        rebound = cls.assemble(
            graph=graph,
            device=origin.device,
            placeholders={} if borrowed else dict(origin.placeholders),
            copy_indices=origin.copy_indices,
            mutated_indices=origin.mutated_indices,
            outputs=origin.outputs,  # one list for the family (Note: [Outputs and threads])
            output_container=origin.output_container,
            aliases=origin.aliases,
            pool_positions=origin.pool_positions,
            static_indices=origin.static_indices,
            static_ptrs=static_pointers(args, origin.static_indices),
            copy_bytes=origin.copy_bytes,
            borrowed=borrowed,
            layouts=origin._layouts,
            static_spans=storage_spans(args, origin.static_indices),
            capture_spans=origin.capture_spans,
            origin=origin,
            count_outputs=False,  # the origin's outputs: counted once, with the origin
        )
        rebound.summary = origin.summary
        return rebound

    def own_placeholders(self) -> dict[int, int]:
        """Give a graph captured on the caller's inputs placeholders of its own; returns their addresses.

        Only a graph whose every read of a dynamic input goes through PI's table may lack them (nothing
        in it reads a captured address), so the new ones serve every later copy."""
        self.placeholders = {
            i: torch.empty_strided(size, stride, dtype=dtype, device=self.device)
            for i, (size, stride, dtype) in self._layouts.items()
        }
        self._dense_placeholders = {i: dense_view(p) for i, p in self.placeholders.items()}
        self.borrowed = False
        return {i: int(p.data_ptr()) for i, p in self.placeholders.items()}

    def static_inputs_unmoved(self, args: Sequence[Any]) -> bool:
        return torch_compat.data_ptrs_equal(args, self.static_ptrs, self.static_indices)

    def copy_in(self, args: Sequence[Any], indices: Sequence[int]) -> None:
        dsts = [self._dense_placeholders[i] for i in indices]
        srcs = [dense_view(args[i]) for i in indices]
        torch_compat.foreach_copy(dsts, srcs)

    def order_streams(self) -> None:
        """Queue what follows on the current stream after all work queued so far on the stream of the
        previous run of this graph or its family (Note: [Stream order])."""
        owner = self.outputs_owner
        key = streams.current_stream_key(self.device)
        if key == owner.last_stream_key:
            return  # the same stream (or no streams): in order already
        stream = streams.current_stream(self.device)
        last = owner.last_stream
        if last is not None:
            stream.wait_stream(last)
            streams.synchronize_device(self.device)  # reads queued on streams grace never saw are done too
        owner.last_stream, owner.last_stream_key = stream, key

    def replay(self) -> None:
        """One replay on the current stream (``run_with_copies``/``run_with_pi`` order it first)."""
        self.graph.replay()

    @property
    def outputs_owner(self) -> CapturedGraph:
        """The graph whose outputs this one writes: itself, or the graph it was rebound from."""
        return self.origin if self.origin is not None else self

    @property
    def shares_outputs(self) -> bool:
        """Whether another graph (grace.rebind) writes this graph's outputs too."""
        return self.origin is not None or self.sharers > 0

    def would_overwrite_held_outputs(self, generation: int) -> bool:
        """Whether replaying now, in compiled call ``generation``, could overwrite outputs of the last
        replay of this graph, or of a graph sharing its outputs, that something still holds (Note:
        [Outputs held within one call])."""
        return self.held_outputs(generation) is not HeldState.NONE

    def held_outputs(self, generation: int) -> HeldState:
        """Whether a replay now, in compiled call ``generation``, would overwrite held outputs."""
        owner = self.outputs_owner
        if not owner.threads_shared and (
            streams.calling_threads.several or owner.last_thread not in (None, threading.get_ident())
        ):
            self.share_across_threads()
        if owner.threads_shared:  # Note: [Outputs and threads]
            return HeldState.HELD if owner._outputs_counted_held() else HeldState.NONE
        if generation != owner.last_generation:
            return HeldState.NONE
        if owner.aliases_since is None:
            owner.aliases_since = generation
            return HeldState.UNKNOWN
        if generation == owner.aliases_since:
            return HeldState.UNKNOWN
        return HeldState.HELD if owner._outputs_counted_held() else HeldState.NONE

    def _outputs_counted_held(self) -> bool:
        return any(torch_compat.storage_use_count(ref) > own for ref, own in self.output_refs)

    def share_across_threads(self) -> None:
        """Note: [Outputs and threads]: replace the graph's own output tensors by fresh ones over the same
        storages (whoever holds the old ones now counts as a holder) and hand out aliases from now on.

        The graphs of a family share one list of outputs (grace.rebind), replaced in place. Each storage's
        own count becomes what it was at capture less the old tensors (with the bases of views) the graph
        held on it, plus the fresh ones; where that cannot be matched it becomes 0 (always held).
        """
        owner = self.outputs_owner
        owner.threads_shared = True
        if owner.aliases_since is None:
            owner.aliases_since = owner.last_generation if owner.last_generation is not None else 0
        outputs = self.outputs
        old = _pool_outputs_all(outputs, self.aliases, self.device)
        keys = list(_pool_outputs(outputs, self.aliases, self.device))
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
        if len(keys) == len(owner.output_refs):
            owner.output_refs = [
                (ref, own - old_impls[key] + new_impls[key])
                for (ref, own), key in zip(owner.output_refs, keys, strict=True)
            ]
        else:
            owner.output_refs = [(ref, 0) for ref, _ in owner.output_refs]

    def last_replayed_by_another(self) -> bool:
        """Whether the last replay that wrote these outputs was another graph's (one rebound from the
        same capture)."""
        return self.outputs_owner.last_writer not in (None, id(self))

    def outputs_read_by(self, args: Sequence[Any], indices: Sequence[int]) -> bool:
        """Whether an input at ``indices`` lies in the storage of one of this graph's outputs in its pool:
        a layer's result handed to the next layer's piece (the outputs of a graph rebound from the same
        capture share those storages, grace.rebind)."""
        spans = self._output_spans
        if spans is None:
            found = _pool_outputs(self.outputs, self.aliases, self.device).values()
            spans = self._output_spans = [(span.start, span.end) for span in map(StorageSpan.of, found)]
        for i in indices:
            a = args[i]
            if isinstance(a, torch.Tensor):
                ptr = a.data_ptr()
                if any(start <= ptr < end for start, end in spans):
                    return True
        return False

    def note_replay(self, generation: int) -> None:
        owner = self.outputs_owner
        owner.last_generation = generation
        owner.last_writer = id(self)
        owner.last_thread = threading.get_ident()

    def collect_outputs(self, args: Sequence[Any], clone: bool) -> Any:
        outs = list(self.outputs)
        pooled = self.pool_positions
        if pooled is None:
            pooled = self.pool_positions = frozenset(_pool_outputs_all(outs, self.aliases, self.device))
        if clone:
            outs = [o.clone() if i in pooled else o for i, o in enumerate(outs)]
        elif self.outputs_owner.aliases_since is not None:
            outs = [
                o.as_strided(o.size(), o.stride(), o.storage_offset()) if i in pooled else o
                for i, o in enumerate(outs)
            ]
        for alias in self.aliases:
            real = args[alias.input_index]
            static = outs[alias.position]
            outs[alias.position] = real.as_strided(
                static.size(), static.stride(), real.storage_offset() + alias.offset_delta
            )
        if self.output_container == "tuple":
            return tuple(outs)
        return outs[0] if self.output_container == "single" else outs

    def run_with_copies(self, args: Sequence[Any], clone: bool) -> Any:
        """Graph with input copies: what PyTorch2-CG does on each call."""
        self.order_streams()
        self.copy_in(args, self.copy_indices)
        self.replay()
        self.copy_back(args, self.mutated_indices)
        return self.collect_outputs(args, clone)

    def run_with_pi(self, args: Sequence[Any], clone: bool) -> Any:
        plan = self.pi_plan
        assert plan is not None
        self.order_streams()  # before the table update: a replay in flight elsewhere may still read it
        copied = plan.uncovered_indices if plan.update(args) else self.copy_indices
        if copied and self.borrowed:
            rebase = getattr(plan, "rebase_placeholders", None)
            if not callable(rebase):
                raise RuntimeError("a graph captured on the caller's inputs needs a plan that can rebase")
            rebase(self.own_placeholders())
            copied = plan.uncovered_indices if plan.update(args) else self.copy_indices
        self.copy_in(args, copied)
        self.replay()
        if self.mutated_indices:
            self.copy_back(args, [i for i in self.mutated_indices if i in copied])
        return self.collect_outputs(args, clone)

    def copy_back(self, args: Sequence[Any], indices: Sequence[int]) -> None:
        for i in indices:
            dense_view(args[i]).copy_(self._dense_placeholders[i])

    def release(self) -> None:
        """Drop the graph, its placeholders and static outputs; the pool is freed with the last of them.

        Graphs rebound from this one (grace.rebind) replay in its pool: the pool is released with the
        last graph of the family, whichever is released last, and then only once no output of it is held
        (grace.pools). Releasing a graph a second time does nothing."""
        release = getattr(self.pi_plan, "release", None)
        if callable(release):
            try:
                release()
            except Exception:  # releasing must not raise out of reset or GC
                logger.debug("grace: PI plan release failed", exc_info=True)
        self.pi_plan = None
        self.outputs = []  # first: what the caller holds is what keeps the pool (grace.pools)
        self.placeholders = {}
        self._dense_placeholders = {}
        origin, self.origin = self.origin, None
        if origin is not None:
            _reset(self.graph)  # the rebound executable graph; the pool is the origin's
            origin.sharers -= 1
            if origin.sharers == 0 and origin._pool_release_pending:
                origin._release_pool()
        elif self.sharers:
            self._pool_release_pending = True
        else:
            self._release_pool()

    def _release_pool(self) -> None:
        self._pool_release_pending = False
        if self._pool_released:
            return
        self._pool_released = True
        graph, pristine, self.pristine = self.graph, self.pristine, None

        def release_pool() -> None:
            _reset(graph)
            _destroy(pristine)

        pools.release_when_unheld([ref for ref, _ in self.output_refs], release_pool)


def _reset(graph: Any) -> None:
    try:
        graph.reset()
    except Exception:
        logger.debug("grace: CUDAGraph.reset failed", exc_info=True)


def _destroy(pristine: int | None) -> None:
    if pristine:
        try:
            cuda_compat.graph_destroy(pristine)
        except Exception:
            logger.debug("grace: destroying the pristine graph failed", exc_info=True)
