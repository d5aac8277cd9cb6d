"""Capture one compiled callable into a CUDA graph with static placeholders, and replay it.

Problem: a CUDA graph replays fixed addresses. Inputs that change from call to call ("dynamic" inputs,
the user's tensors) must be read from addresses known at capture: placeholders the runner copies into
(what PyTorch2-CG does), or, with parameter indirection, slots that PI points at the real inputs.
Parameters and buffers ("static" inputs) are used in place and must not move. Outputs are allocated in
the graph's private memory pool during capture and rewritten by every replay.

Design: ``capture_graph`` warms nothing up (the runner has already run the callable once on the
capture stream), swaps the dynamic inputs for placeholders, captures on grace's side stream into a
private pool, hands the raw ``cudaGraph_t`` to the hooks (stats, then PI through ``CaptureContext``)
before instantiation, and returns a ``CapturedGraph``. Outputs that are views of a placeholder are
rebuilt as views of the caller's real input on each replay, so aliasing is what eager gives. With
``keep_pristine`` it also keeps a copy of the captured graph as it was before the hooks, from which
grace.rebind makes graphs for other addresses of the static inputs; such graphs replay in the captured
graph's pool and write its outputs (a family: ``CapturedGraph.origin`` and ``sharers``).

Invariants:
- the hooks see the graph before ``instantiate``: edits made there are in every replay;
- ``CapturedGraph.run`` copies every dynamic input the graph reads through a placeholder before the
  replay and copies mutated dynamic inputs back after it;
- a failed capture leaves no capture open on the stream (``capture_end`` in ``finally``) and raises
  ``CaptureError`` carrying a ``SkipReason``;
- no graph reads a cuBLAS workspace outside its own pool (Note: [cuBLAS workspaces]);
- placeholders live in the default pool, never in a graph's private pool, so they can be shared: the
  deciding call captures the graph-with-copies and the PI graph against one set of placeholders
  (``capture_graph(..., placeholders=...)``), which halves the placeholder memory of a decision. Two
  graphs sharing placeholders must run one after the other on one stream (each replay copies what it
  reads into them first), and a released graph drops only its references to them;
- a graph captured on the caller's own inputs (``borrow_inputs``, option ``pi_direct``) keeps no
  reference to them: it has no placeholders until a call needs one (``CapturedGraph.own_placeholders``),
  and nothing is ever copied into an input of the capturing call;
- the pool of a captured graph lives until the last graph of its family is released
  (``CapturedGraph.release``), whichever that is, and then for as long as any output of it is still
  held (grace.pools); the pristine copy is destroyed with it;
- every use of a graph's placeholders, pointer table, pool and outputs is queued after all work queued
  so far on the stream of the previous use (Note: [Stream order]);
- the outputs a call from one thread received are never overwritten by a replay for another thread
  while they are held (Note: [Outputs and threads]).

Note: [Stream order]
A replay reads its placeholders and pointer table and writes its pool (intermediates and outputs) on the
caller's current stream. Work the user queued on another stream after the previous call may still read
that call's outputs (or, for a graph of a family, grace.rebind, the pool's intermediates are another
graph's in flight). So every run through ``run_with_copies``/``run_with_pi`` first makes the current
stream wait for everything queued so far on the stream of the previous run of the graph or of its family
(``torch.cuda.Stream.wait_stream``: an event recorded on that stream now); since the user may also
have read the outputs on a third stream that grace never saw, a change of stream also waits for the
device to finish everything queued so far (one synchronisation per change; a call on the stream of the
previous one waits for nothing). This comes before the input copies, the table update and the replay;
copies back into mutated inputs and output clones follow on the current stream. The stream is kept with
the family's captured graph (``outputs_owner.last_stream``). A read on a third stream followed by a call
on the previous call's own stream is the caller's to order (``wait_stream``), as for any tensor that two
streams use. The runner's lock (grace.runner) makes the host side of two calls never overlap,
so the stream recorded is the one of the call queued last.

Note: [Outputs and threads]
Dynamo's count of top-level calls is shared by all threads: a call from another thread in between looks
like a new call of this thread, so Note: [Outputs held within one call] cannot tell one thread's calls
apart once grace serves several threads, and a thread cannot know when another thread's call
overwrites the outputs it received. So the first time a graph (or its family) is about to replay for a
thread other than the one its last replay served, or once the runners have been called from more than
one thread at all (``calling_threads``, noted by the runner on every call and forgotten by
``grace.reset()``), it stops handing out its own tensors: it replaces them by fresh
tensors over the same storages (``CapturedGraph.share_across_threads``), so that whatever was handed out
before counts in the storages' use counts, and hands out aliases from then on. From then on a replay
happens only when no output of the previous replay is held, by any thread (``held_outputs`` returns
``HeldState.HELD`` otherwise and the runner runs that call without the graph). With ``clone_outputs=True`` no
output of the pool is handed out and the rule never applies.

Note: [cuBLAS workspaces]
cuBLAS keeps a workspace per (handle, stream), allocated on a stream's first
matmul. A graph captured while a workspace from the default pool exists reads and writes that memory on
every replay, and anyone may free it (cudagraph trees clear every workspace around each recording): the
memory would then serve other tensors while the graph still scribbles on it. So, as cudagraph trees do,
the workspaces are cleared right before each capture (the capture allocates its own in the graph's
private pool, alive with the graph) and right after it (the pool's block is then free in the allocator's
books but used by nobody but the graph, since nothing else allocates from that pool). This also leaves
one workspace, not two, in the first calls: the warm-up's on the capture stream is dropped before the
no-graph runs on the caller's stream allocate theirs. Every no-graph run grace makes itself starts
without a workspace as well: one held from an earlier run would sit beside the transient workspaces of
its cuDNN convolutions. So the checks' runs (grace.verify) drop it before and after, and SCG's timed
no-graph samples drop it before each sample, outside the timed region (``grace.scg.time_variants``'s
``untimed_setup``); what a sample then times beyond Inductor's steady state is taking the workspace back
from the allocator's cache at its first matmul (figures in docs/design/runtime.md).

Note: [Outputs held within one call]
A graph's outputs live in its pool and its next replay writes them again. Across calls of a compiled
model that is the documented contract (as with cudagraph trees): clone what you keep, or set
``clone_outputs``. Within one call it is not something a user can see or avoid: Dynamo runs one compiled
piece (the code after a graph break in a layer, a helper function) once per layer, and a model that keeps
every layer's result (attention maps, hidden states) would find all of them equal to the last. So the
runner tells calls apart as cudagraph trees do (``grace.compat.torch.compiled_call_generation``: Dynamo's
count of top-level calls, or the user's ``cudagraph_mark_step_begin``) and never replays a graph a second
time in one call while an output of its previous replay is held: that call runs without the graph. The
first time a graph comes back within one call, the outputs it handed out were its own tensors, whose
holders cannot be counted, so it does not replay again in that call; from the next call on it hands out
aliases of its outputs, and a replay within the same call is allowed when the storages' use counts are
back to what the graph's own tensors give them (every alias and every view made of one has died). Graphs
rebound from one capture (grace.rebind) write the same outputs and count as one graph here: the state
lives with the captured graph (``CapturedGraph.outputs_owner``), with which graph replayed last
(``last_replayed_by_another``), so that the runner can tell a layer that holds another layer's outputs
(Note: [Layers that hold each other's outputs] in grace.rebind).

Note: [PI seam] ``grace.pi.prepare(ctx)`` receives a ``CaptureContext`` and returns an object satisfying
``PIPlan`` or a ``SkipReason``. Before each replay the runner calls ``plan.update(inputs)``: True means
the pointer table now points at ``inputs`` for every index not in ``plan.uncovered_indices`` (those are
still copied into their placeholders); False means the plan has pointed every slot at its placeholder and
the runner copies all dynamic inputs this call. A plan of a graph captured on the caller's inputs also
has ``rebase_placeholders(addresses)``: the runner calls it when such a graph first needs placeholders.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from grace import pools
from grace.compat import cuda as cuda_compat
from grace.compat import torch as torch_compat
from grace.cudagraph import GraphSummary, graph_summary
from grace.reasons import SkipCode, SkipReason

logger = logging.getLogger(__name__)


class HeldState(enum.Enum):
    """Whether a replay now could overwrite outputs of the last replay that something still holds (Note:
    [Outputs held within one call])."""

    NONE = "none"  # a replay overwrites nothing still held
    UNKNOWN = "unknown"  # the last replay in this call handed out the outputs themselves: not countable
    HELD = "held"  # counted: an alias or a view of an output is alive


class CaptureError(RuntimeError):
    """Capture, instantiation or the first replay failed; ``reason`` says how."""

    def __init__(self, reason: SkipReason) -> None:
        super().__init__(str(reason))
        self.reason = reason


@dataclass(frozen=True)
class StorageSpan:
    """Where a tensor's data sits: its data pointer and its storage's address range."""

    data_ptr: int
    start: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.start + self.nbytes

    @classmethod
    def of(cls, t: torch.Tensor) -> StorageSpan:
        storage = t.untyped_storage()
        return cls(int(t.data_ptr()), int(storage.data_ptr()), int(storage.nbytes()))


def static_pointers(args: Sequence[Any], static_indices: Sequence[int]) -> list[int | None]:
    """``data_ptr()`` of each static input by position (None elsewhere): where a graph reads them."""
    pointers: list[int | None] = [None] * len(args)
    for i in static_indices:
        pointers[i] = args[i].data_ptr()
    return pointers


def storage_spans(args: Sequence[Any], indices: Sequence[int]) -> dict[int, StorageSpan]:
    return {i: StorageSpan.of(args[i]) for i in indices if isinstance(args[i], torch.Tensor)}


@dataclass(frozen=True)
class CaptureContext:
    """What PI (and any other graph editor) sees of a graph between capture and instantiation.

    Attributes:
        graph_handle: the ``cudaGraph_t`` as an int; valid only during the hook call.
        placeholders: input index -> the static tensor whose address the graph captured for it.
        dynamic_input_indices: indices of the callable's tensor inputs that change between calls.
        compiled: the Inductor-compiled callable that was captured.
        output_codes: Inductor ``OutputCode`` objects of the forward graph (the generated module with its
            Triton kernels, see ``grace.compat.torch.inductor_module_globals``); empty when a warm cache
            skipped Inductor's inner compile.
        device: the CUDA device of the graph.
        example_inputs: the real inputs of the capturing call (for alignment and view checks).
        pi_table_update: option ``pi_table_update`` (how PI writes its pointer table per replay).
        placeholder_spans: where the graph reads each dynamic input when that is not ``placeholders``
            (a graph rebound by grace.rebind reads its origin's capture addresses); None: placeholders.
    """

    graph_handle: int
    placeholders: Mapping[int, torch.Tensor]
    dynamic_input_indices: tuple[int, ...]
    compiled: Callable[..., Any]
    output_codes: tuple[Any, ...]
    device: torch.device
    example_inputs: tuple[Any, ...] = ()
    pi_table_update: str = "node"
    placeholder_spans: Mapping[int, StorageSpan] | None = None


@runtime_checkable
class PIPlan(Protocol):
    """A prepared parameter indirection for one graph (see Note: [PI seam])."""

    @property
    def uncovered_indices(self) -> tuple[int, ...]: ...

    @property
    def bytes_per_replay(self) -> int: ...

    @property
    def stages(self) -> list[tuple[str, str, str]]: ...

    def update(self, inputs: Sequence[Any]) -> bool: ...


GraphHook = Callable[[int, Mapping[int, torch.Tensor]], None]
"""Called with the raw graph handle and the placeholders, before instantiation."""


def dense_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` narrowed to length 1 along broadcast (stride 0) dimensions, so it can be copied into."""
    if all(s != 0 or n <= 1 for s, n in zip(t.stride(), t.shape, strict=True)):
        return t
    index = tuple(
        slice(0, 1) if s == 0 and n > 1 else slice(None) for s, n in zip(t.stride(), t.shape, strict=True)
    )
    return t[index]


def make_placeholder(t: torch.Tensor) -> torch.Tensor:
    """A fresh tensor with ``t``'s size, strides and dtype on ``t``'s device (storage offset 0)."""
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)


def placeholders_for(
    args: Sequence[Any], dynamic_indices: Sequence[int], shared: Mapping[int, torch.Tensor] | None = None
) -> dict[int, torch.Tensor]:
    """The placeholders a capture of ``args`` reads its dynamic inputs from: fresh ones, or ``shared``.

    ``shared`` (the placeholders of another graph of the same call) must hold exactly the dynamic
    indices, each with its input's size, strides, dtype and device: a graph captured against a
    placeholder of another layout would read the copied input wrongly. Raises ``ValueError`` otherwise.
    """
    if shared is None:
        return {i: make_placeholder(args[i]) for i in dynamic_indices}
    if set(shared) != set(dynamic_indices):
        raise ValueError(
            f"shared placeholders cover inputs {sorted(shared)}, the capture needs {sorted(dynamic_indices)}"
        )
    for i in dynamic_indices:
        p, t = shared[i], args[i]
        if (p.size(), p.stride(), p.dtype, p.device) != (t.size(), t.stride(), t.dtype, t.device):
            raise ValueError(
                f"shared placeholder {i} is {tuple(p.shape)}/{p.stride()}/{p.dtype}/{p.device}, "
                f"input {i} is {tuple(t.shape)}/{t.stride()}/{t.dtype}/{t.device}"
            )
    return {i: shared[i] for i in dynamic_indices}


def poison_placeholders(placeholders: Mapping[int, torch.Tensor]) -> None:
    """Fill the placeholders with zeros.

    A graph reads a placeholder only after the runner copied the input into it, so this never changes
    a correct result; a graph that reads a placeholder it should not (a PI slot left at its capture
    address) then computes with zeros instead of the last copied values, and fails its numeric check
    unless its output does not depend on that input. Zeros, not NaN: a broken graph that turns the value
    into an index or a size must stay in bounds (a fault would end the process, not just the variant);
    the first call at other addresses is verified against eager again (grace.verify).
    """
    for p in placeholders.values():
        dense_view(p).zero_()


@dataclass(frozen=True)
class OutputAlias:
    """Output ``position`` is a view of dynamic input ``input_index``'s storage."""

    position: int
    input_index: int
    offset_delta: int  # output storage offset minus the placeholder's storage offset


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
        key = current_stream_key(self.device)
        if key == owner.last_stream_key:
            return  # the same stream (or no streams): in order already
        stream = current_stream(self.device)
        last = owner.last_stream
        if last is not None:
            stream.wait_stream(last)
            synchronize_device(self.device)  # reads queued on streams grace never saw are done too
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
            calling_threads.several or owner.last_thread not in (None, threading.get_ident())
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


class CallingThreads:
    """Whether calls of grace's runners have come from more than one thread since the last reset (Note:
    [Outputs and threads]): Dynamo's call count then moves with every thread's calls."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.several = False

    def note(self) -> None:
        if self.several:
            return
        ident = threading.get_ident()
        if self.first is None:
            self.first = ident
        elif ident != self.first:
            self.several = True

    def forget(self) -> None:
        self.first, self.several = None, False


calling_threads = CallingThreads()

_side_streams: dict[int, torch.cuda.Stream] = {}
# Note: [One side stream]: warm-ups and captures of every runner share grace's side stream, and a stream
# that captures takes in whatever any thread queues on it; so they run one at a time, across runners and
# threads, and no thread clears cuBLAS's workspaces during a capture (each runner's own lock is taken
# first, this one second, never the other way round).
_side_stream_lock = torch_compat.capture_lock


def current_stream(device: torch.device) -> Any:
    """The stream a run on ``device`` is queued on now (None for a device without streams)."""
    if device.type != "cuda":
        return None
    return torch.cuda.current_stream(device)


def synchronize_device(device: torch.device) -> None:
    """Wait until ``device`` has finished everything queued so far, on every stream."""
    if device.type == "cuda" and torch_compat.cuda_available():
        torch.cuda.synchronize(device)


def current_stream_key(device: torch.device) -> int | None:
    """The handle of ``current_stream(device)``, cheaper to get (None for a device without streams)."""
    if device.type != "cuda":
        return None
    return torch_compat.current_raw_stream(device)


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """grace's capture stream for ``device`` (one per device, created on first use)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _side_streams.get(index)
    if stream is None:
        stream = torch.cuda.Stream(device=index)
        _side_streams[index] = stream
    return stream


def run_on_side_stream(fn: Callable[..., Any], args: Sequence[Any], device: torch.device) -> Any:
    """Run ``fn(*args)`` on grace's side stream, ordered after and before the current stream's work.

    The warm-up call runs here, on the stream that captures; the cuBLAS workspace it allocated for that
    stream is dropped afterwards (Note: [cuBLAS workspaces]), so the no-graph runs that follow on the
    caller's stream reuse its memory instead of holding a second one beside it.
    """
    with _side_stream_lock:  # Note: [One side stream]
        stream = side_stream(device)
        current = torch.cuda.current_stream(device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            out = fn(*args)
        current.wait_stream(stream)
        torch_compat.clear_cublas_workspaces()
    return out


def _storage_ptr(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


def _in_pool(value: Any, device: torch.device) -> bool:
    """An output tensor the graph wrote on its device (graph outputs on other devices are refused)."""
    return isinstance(value, torch.Tensor) and value.device == device


def _pool_outputs_all(
    outputs: list[Any], aliases: Sequence[OutputAlias], device: torch.device
) -> dict[int, torch.Tensor]:
    """Position -> output tensor, for every output in the graph's pool (views of inputs left out)."""
    viewing_inputs = {a.position for a in aliases}
    return {
        position: out
        for position, out in enumerate(outputs)
        if position not in viewing_inputs and _in_pool(out, device)
    }


def _pool_outputs(
    outputs: list[Any], aliases: Sequence[OutputAlias], device: torch.device
) -> dict[int, torch.Tensor]:
    """One output tensor per storage the graph's pool holds for its outputs (views of inputs left out)."""
    found: dict[int, torch.Tensor] = {}
    for out in _pool_outputs_all(outputs, aliases, device).values():
        found.setdefault(_storage_ptr(out), out)
    return found


def output_refs(
    outputs: list[Any], aliases: Sequence[OutputAlias], device: torch.device
) -> list[tuple[Any, int]]:
    """(weak reference, use count) per storage of the outputs that live in the graph's pool, the counts
    taken while only the graph's own tensors hold them."""
    refs = [torch_compat.storage_weak_ref(t) for t in _pool_outputs(outputs, aliases, device).values()]
    return [(ref, torch_compat.storage_use_count(ref)) for ref in refs]


def pool_positions(
    outputs: list[Any],
    aliases: Sequence[OutputAlias],
    device: torch.device,
    args: Sequence[Any],
    static_indices: Sequence[int],
) -> frozenset[int]:
    """Positions of the outputs the graph wrote in its pool: not views of a dynamic input (``aliases``)
    nor of a static input (a parameter or buffer returned as it is)."""
    static = {_storage_ptr(args[i]) for i in static_indices if isinstance(args[i], torch.Tensor)}
    return frozenset(
        position
        for position in _pool_outputs_all(outputs, aliases, device)
        if _storage_ptr(outputs[position]) not in static
    )


def pool_output_bytes(outputs: list[Any], aliases: Sequence[OutputAlias], device: torch.device) -> int:
    return sum(int(t.untyped_storage().nbytes()) for t in _pool_outputs(outputs, aliases, device).values())


def _find_aliases(
    outputs: list[Any], placeholders: dict[int, torch.Tensor], device: torch.device
) -> tuple[OutputAlias, ...]:
    by_storage = {_storage_ptr(p): i for i, p in placeholders.items()}
    aliases = []
    for position, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            continue
        if out.device != device:
            raise CaptureError(SkipReason(SkipCode.CPU_OUTPUT, f"output {position} is on {out.device}"))
        index = by_storage.get(_storage_ptr(out))
        if index is None:
            continue
        placeholder = placeholders[index]
        if out.dtype != placeholder.dtype:
            raise CaptureError(
                SkipReason(
                    SkipCode.UNSUPPORTED_OUTPUT_ALIAS,
                    f"output {position} views input {index} as {out.dtype} (input is {placeholder.dtype})",
                )
            )
        aliases.append(OutputAlias(position, index, int(out.storage_offset() - placeholder.storage_offset())))
    return tuple(aliases)


def capture_graph(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    device: torch.device,
    dynamic_indices: Sequence[int],
    static_indices: Sequence[int],
    mutated_indices: Sequence[int],
    hooks: Sequence[GraphHook] = (),
    placeholders: Mapping[int, torch.Tensor] | None = None,
    borrow_inputs: bool = False,
    keep_pristine: bool = False,
) -> CapturedGraph:
    """Capture ``fn`` with placeholders for ``dynamic_indices``; run ``hooks`` on the raw graph.

    ``placeholders``: those of another graph of the same inputs, to read from instead of fresh ones
    (see the invariants above and ``placeholders_for``). ``borrow_inputs``: capture on the inputs
    themselves (the hooks see them as the placeholders) and return a graph without placeholders
    (``CapturedGraph.borrowed``); only for a graph whose hooks redirect every read of them (PI), and only
    where ``borrow_blocker`` finds nothing. An output that views an input raises ``CaptureError``.
    ``keep_pristine``: keep a copy of the captured graph as it was before the hooks (grace.rebind serves
    other addresses of the static inputs from it); only where this torch keeps the captured graph.
    """
    if borrow_inputs:
        blocker = borrow_blocker(args, dynamic_indices, static_indices)
        if blocker:
            raise CaptureError(SkipReason(SkipCode.PI_DIRECT_DECLINED, blocker))
        placeholders = {i: args[i] for i in dynamic_indices}
    placeholders = placeholders_for(args, dynamic_indices, placeholders)
    capture_args = list(args)
    for i, placeholder in placeholders.items():
        capture_args[i] = placeholder
    keep_graph = torch_compat.has_keep_graph()
    try:
        graph = torch_compat.new_cuda_graph(keep_graph=keep_graph)
    except Exception as exc:
        raise CaptureError(SkipReason(SkipCode.CAPTURE_FAILED, f"CUDAGraph(): {exc}")) from exc

    with _side_stream_lock:  # Note: [One side stream]
        stream = side_stream(device)
        current = torch.cuda.current_stream(device)
        stream.wait_stream(current)
        hook_errors: list[BaseException] = []
        outputs: Any = None
        try:
            with torch.cuda.stream(stream):
                torch_compat.clear_cublas_workspaces()  # Note: [cuBLAS workspaces]
                torch_compat.capture_begin(graph)
                try:
                    outputs = fn(*capture_args)
                    if not keep_graph and hooks:
                        _run_hooks(
                            hooks, cuda_compat.capturing_graph(stream.cuda_stream), placeholders, hook_errors
                        )
                finally:
                    graph.capture_end()
                    torch_compat.clear_cublas_workspaces()
        except Exception as exc:
            _reset(graph)
            cuda_compat.clear_last_error()
            raise CaptureError(SkipReason(SkipCode.CAPTURE_FAILED, f"{type(exc).__name__}: {exc}")) from exc
        finally:
            current.wait_stream(stream)

    pristine = _pristine_copy(graph) if keep_graph and keep_pristine else None
    if keep_graph:
        try:
            with torch.cuda.device(device):  # hooks load modules and instantiate in the graph's context
                if hooks:
                    _run_hooks(hooks, int(graph.raw_cuda_graph()), placeholders, hook_errors)
                graph.instantiate()
        except Exception as exc:
            _reset(graph)
            _destroy(pristine)
            raise CaptureError(
                SkipReason(SkipCode.INSTANTIATE_FAILED, f"{type(exc).__name__}: {exc}")
            ) from exc
    if hook_errors:
        _reset(graph)
        _destroy(pristine)
        first = hook_errors[0]
        raise CaptureError(
            SkipReason(SkipCode.CAPTURE_FAILED, f"graph hook: {type(first).__name__}: {first}")
        )

    if isinstance(outputs, tuple):
        container, out_list = "tuple", list(outputs)
    elif isinstance(outputs, list):
        container, out_list = "list", list(outputs)
    else:
        container, out_list = "single", [outputs]
    try:
        aliases = _find_aliases(out_list, placeholders, device)
        if borrow_inputs and aliases:
            why = f"output {aliases[0].position} views input {aliases[0].input_index}"
            raise CaptureError(SkipReason(SkipCode.PI_DIRECT_DECLINED, why))
    except CaptureError:
        _reset(graph)
        _destroy(pristine)
        raise
    copy_indices = tuple(sorted(placeholders))
    del outputs  # the same tensors as out_list: only the graph holds them from here on
    return CapturedGraph.assemble(
        graph=graph,
        device=device,
        placeholders=placeholders,
        copy_indices=copy_indices,
        mutated_indices=tuple(i for i in mutated_indices if i in placeholders),
        outputs=out_list,
        output_container=container,
        aliases=aliases,
        pool_positions=pool_positions(out_list, aliases, device, args, static_indices),
        static_indices=tuple(static_indices),
        static_ptrs=static_pointers(args, static_indices),
        copy_bytes=sum(dense_view(args[i]).nbytes for i in copy_indices),
        borrowed=borrow_inputs,
        pristine=pristine,
        static_spans=storage_spans(args, static_indices),
        capture_spans={i: StorageSpan.of(p) for i, p in placeholders.items()},
    )


def borrow_blocker(args: Sequence[Any], dynamic_indices: Sequence[int], static_indices: Sequence[int]) -> str:
    """Why a capture may not read the dynamic inputs in place (empty when it may).

    PI tells an input's uses apart by the address range of its storage, and output aliases are found by
    storage: two dynamic inputs that share a storage, or one that shares a static input's, would be
    confused."""
    owner: dict[int, int] = {}
    for i in dynamic_indices:
        t = args[i]
        if not isinstance(t, torch.Tensor):
            return f"input {i} is not a tensor"
        key = _storage_ptr(t)
        if key in owner:
            return f"inputs {owner[key]} and {i} share a storage"
        owner[key] = i
    for i in static_indices:
        t = args[i]
        if isinstance(t, torch.Tensor) and _storage_ptr(t) in owner:
            return f"input {owner[_storage_ptr(t)]} shares a storage with static input {i}"
    for i in dynamic_indices:
        if not args[i].is_cuda:
            return f"input {i} is not a CUDA tensor"
    return ""


def _run_hooks(
    hooks: Sequence[GraphHook],
    handle: int,
    placeholders: Mapping[int, torch.Tensor],
    errors: list[BaseException],
) -> None:
    for hook in hooks:
        try:
            hook(handle, placeholders)
        except Exception as exc:  # recorded and turned into a CaptureError after capture_end
            errors.append(exc)
            return


def _pristine_copy(graph: Any) -> int | None:
    """A copy of the captured graph before any hook edits it; None where it cannot be made."""
    if cuda_compat.driver() is None:
        return None
    try:
        return cuda_compat.graph_clone(int(graph.raw_cuda_graph()))
    except Exception:
        logger.debug("grace: cloning the captured graph failed", exc_info=True)
        return None


def _destroy(pristine: int | None) -> None:
    if pristine:
        try:
            cuda_compat.graph_destroy(pristine)
        except Exception:
            logger.debug("grace: destroying the pristine graph failed", exc_info=True)


def _reset(graph: Any) -> None:
    try:
        graph.reset()
    except Exception:
        logger.debug("grace: CUDAGraph.reset failed", exc_info=True)


def summary_hook(sink: dict[str, Any]) -> GraphHook:
    """A hook that stores the node counts of the graph under ``sink["summary"]`` (or the error)."""

    def hook(handle: int, placeholders: Mapping[int, torch.Tensor]) -> None:
        if cuda_compat.driver() is None:
            sink["summary_error"] = f"cuda-bindings unavailable: {cuda_compat.import_error()}"
            return
        try:
            sink["summary"] = graph_summary(handle)
        except Exception as exc:  # counting is informational; never fail a capture for it
            sink["summary_error"] = f"{type(exc).__name__}: {exc}"

    return hook
