"""Capture one compiled callable into a CUDA graph with static placeholders.

Problem: a CUDA graph replays fixed addresses, so a capture must read the dynamic inputs from
placeholders (grace.placeholders), find which outputs live in the graph's pool and which view an input
(grace.outputs), let PI edit the graph before instantiation (Note: [PI seam]), and leave nothing behind
when it fails.

Design: ``capture_graph`` warms nothing up (the runner has already run the callable once on the
capture stream), swaps the dynamic inputs for placeholders, captures on grace's side stream
(grace.streams) into a private pool, hands the raw ``cudaGraph_t`` to the hooks (stats, then PI through
``CaptureContext``) before instantiation, and returns a ``CapturedGraph`` (grace.graph). With
``keep_pristine`` it also keeps a copy of the captured graph as it was before the hooks, from which
grace.rebind makes graphs for other addresses of the static inputs; such graphs replay in the captured
graph's pool and write its outputs (a family). This module also re-exports the names the rest of grace
and the tests import from it.

Invariants:
- the hooks see the graph before ``instantiate``: edits made there are in every replay;
- a failed capture leaves no capture open on the stream (``capture_end`` in ``finally``) and raises
  ``CaptureError`` carrying a ``SkipReason``;
- no graph reads a cuBLAS workspace outside its own pool (Note: [cuBLAS workspaces]);
- placeholders can be shared between the graphs of one deciding call (``placeholders=...``; the rule
  in grace.placeholders); a capture on the caller's inputs (``borrow_inputs``) keeps only those of
  the inputs it could not read in place (``own_placeholder_inputs``: a storage another input shares).

Note: [PI seam] ``grace.pi.prepare(ctx)`` receives a ``CaptureContext`` and returns an object satisfying
``PIPlan`` or a ``SkipReason``. Before each replay the runner calls ``plan.update(inputs)``: True means
the pointer table now points at ``inputs`` for every index not in ``plan.uncovered_indices`` (those are
still copied into their placeholders); False means the plan has pointed every slot at its placeholder and
the runner copies all dynamic inputs this call. A plan of a graph captured on the caller's inputs also
has ``rebase_placeholders(addresses)``: the runner calls it when such a graph first needs placeholders.

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
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grace import poolgroups, pools
from grace.compat import allocator
from grace.compat import cuda as cuda_compat
from grace.compat import torch as torch_compat
from grace.cudagraph import graph_summary
from grace.graph import CapturedGraph, _destroy, _reset
from grace.outputs import (
    HeldState,
    OutputAlias,
    _storage_ptr,
    output_refs,
    pool_output_bytes,
    pool_positions,
)
from grace.pi_contract import PIPlan
from grace.placeholders import (
    StorageSpan,
    dense_view,
    make_placeholder,
    placeholders_for,
    poison_placeholders,
    static_pointers,
    storage_spans,
)
from grace.reasons import SkipCode, SkipReason
from grace.streams import (
    CallingThreads,
    _side_stream_lock,
    calling_threads,
    current_stream,
    current_stream_key,
    run_on_side_stream,
    side_stream,
    synchronize_device,
)

__all__ = [
    "CallingThreads",
    "CaptureContext",
    "CaptureError",
    "CapturedGraph",
    "GraphHook",
    "HeldState",
    "OutputAlias",
    "PIPlan",
    "StorageSpan",
    "borrow_blocker",
    "calling_threads",
    "capture_graph",
    "current_stream",
    "current_stream_key",
    "dense_view",
    "make_placeholder",
    "output_refs",
    "own_placeholder_inputs",
    "placeholders_for",
    "poison_placeholders",
    "pool_output_bytes",
    "pool_positions",
    "run_on_side_stream",
    "side_stream",
    "static_pointers",
    "storage_spans",
    "summary_hook",
    "synchronize_device",
]

logger = logging.getLogger(__name__)


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
        pi_vendor_update: option ``pi_vendor_update`` (how vendor nodes get moved addresses).
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
    pi_vendor_update: str = "host"
    placeholder_spans: Mapping[int, StorageSpan] | None = None


GraphHook = Callable[[int, Mapping[int, torch.Tensor]], None]
"""Called with the raw graph handle and the placeholders, before instantiation."""


class CaptureError(RuntimeError):
    """Capture, instantiation or the first replay failed; ``reason`` says how."""

    def __init__(self, reason: SkipReason) -> None:
        super().__init__(str(reason))
        self.reason = reason


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
    kept_from: int | None = None,
    pool_group: poolgroups.PoolGroup | None = None,
    pool_kin: object = None,
) -> CapturedGraph:
    """Capture ``fn`` with placeholders for ``dynamic_indices``; run ``hooks`` on the raw graph.

    ``placeholders``: another graph's of the same inputs, read instead of fresh ones (the invariants
    above). ``borrow_inputs``: read the inputs in place (the hooks see them as placeholders; the graph
    keeps their layouts, ``CapturedGraph.borrowed``) but for those ``own_placeholder_inputs`` names;
    only for PI graphs, where ``borrow_blocker`` finds nothing; an output viewing an input raises
    ``CaptureError``. ``keep_pristine``: keep a copy of the graph as before the hooks (grace.rebind),
    where this torch keeps the captured graph. ``kept_from``: Note: [Outputs autograd keeps].
    ``pool_group``: capture into its pool and join it, serving callable ``pool_kin`` (grace.poolgroups).
    """
    placeholders, own = _capture_placeholders(
        args, dynamic_indices, static_indices, placeholders, borrow_inputs
    )
    pools.hand_back_before_capture()  # Note: [Hand back before a capture] in grace.pools
    capture_args = [placeholders.get(i, a) for i, a in enumerate(args)]
    keep_graph = torch_compat.has_keep_graph()
    graph = _new_graph(keep_graph)
    hook_errors: list[BaseException] = []
    in_capture = hooks if not keep_graph else ()
    reading = poolgroups.CaptureReading()  # the group's pool around the capture
    outputs = _record(
        fn, capture_args, graph, device, in_capture, placeholders, hook_errors, pool_group, reading
    )
    pristine = _pristine_copy(graph) if keep_graph and keep_pristine else None
    if keep_graph:
        _instantiate(graph, device, hooks, placeholders, hook_errors, pristine)
    _raise_hook_errors(hook_errors, graph, pristine)
    container, out_list = _output_list(outputs)
    del outputs  # the same tensors as out_list: only the graph holds them from here on
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
    captured = CapturedGraph.assemble(
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
        own_indices=own,
        pristine=pristine,
        static_spans=storage_spans(args, static_indices),
        capture_spans={i: StorageSpan.of(p) for i, p in placeholders.items()},
        kept_from=kept_from,
    )
    if pool_group is not None:
        _join(captured, pool_group, pool_kin, reading)
    return captured


def _new_graph(keep_graph: bool) -> Any:
    try:
        return torch_compat.new_cuda_graph(keep_graph=keep_graph)
    except Exception as exc:
        raise CaptureError(SkipReason(SkipCode.CAPTURE_FAILED, f"CUDAGraph(): {exc}")) from exc


def _join(
    captured: CapturedGraph, group: poolgroups.PoolGroup, kin: object, reading: poolgroups.CaptureReading
) -> None:
    """``captured`` joins ``group`` with the footprint its capture's ``reading`` gives (Note: [What a
    replay can overwrite] in grace.poolgroups)."""
    captured.join_pool_group(group, kin, reading.footprint(captured.output_spans()))


def _raise_hook_errors(hook_errors: Sequence[BaseException], graph: Any, pristine: int | None) -> None:
    """A hook that failed makes the capture fail: the graph and its pristine copy go."""
    if hook_errors:
        _reset(graph)
        _destroy(pristine)
        first = hook_errors[0]
        raise CaptureError(
            SkipReason(SkipCode.CAPTURE_FAILED, f"graph hook: {type(first).__name__}: {first}")
        )


def _capture_placeholders(
    args: Sequence[Any],
    dynamic_indices: Sequence[int],
    static_indices: Sequence[int],
    shared: Mapping[int, torch.Tensor] | None,
    borrow_inputs: bool,
) -> tuple[dict[int, torch.Tensor], frozenset[int]]:
    """What the capture reads for each dynamic input: the inputs themselves (``borrow_inputs``; fresh
    placeholders where ``own_placeholder_inputs`` names one, returned as the second item), ``shared``
    placeholders or fresh ones."""
    if not borrow_inputs:
        return placeholders_for(args, dynamic_indices, shared), frozenset()
    blocker = borrow_blocker(args, dynamic_indices)
    if blocker:
        raise CaptureError(SkipReason(SkipCode.PI_DIRECT_DECLINED, blocker))
    own = own_placeholder_inputs(args, dynamic_indices, static_indices)
    return {i: make_placeholder(args[i]) if i in own else args[i] for i in dynamic_indices}, frozenset(own)


def _record(
    fn: Callable[..., Any],
    capture_args: Sequence[Any],
    graph: Any,
    device: torch.device,
    hooks: Sequence[GraphHook],
    placeholders: Mapping[int, torch.Tensor],
    hook_errors: list[BaseException],
    pool_group: poolgroups.PoolGroup | None,
    reading: poolgroups.CaptureReading,
) -> Any:
    """Run ``fn`` on ``capture_args`` under capture on grace's side stream; returns its outputs.
    ``hooks`` run on the graph being captured (where this torch keeps no captured graph); the capture
    goes into ``pool_group``'s pool (its layout before and after and the capture's allocations into
    ``reading``), or a private one."""
    with _side_stream_lock:  # Note: [One side stream]
        stream = side_stream(device)
        current = torch.cuda.current_stream(device)
        stream.wait_stream(current)
        outputs: Any = None
        try:
            with torch.cuda.stream(stream):
                torch_compat.clear_cublas_workspaces()  # Note: [cuBLAS workspaces]
                handle = pool_group.capture_handle() if pool_group is not None else None
                if handle is not None:
                    reading.before = allocator.pool_layout(device, handle)
                with allocator.AllocationTrace(device, active=handle is not None) as trace:
                    torch_compat.capture_begin(graph, handle)
                    try:
                        outputs = fn(*capture_args)
                        if hooks:
                            capturing = cuda_compat.capturing_graph(stream.cuda_stream)
                            _run_hooks(hooks, capturing, placeholders, hook_errors)
                    finally:
                        graph.capture_end()
                        torch_compat.clear_cublas_workspaces()
                if handle is not None:
                    reading.after = allocator.pool_layout(device, handle, trace.segments)
                    reading.allocated = trace.allocated
        except Exception as exc:
            _reset(graph)
            cuda_compat.clear_last_error()
            if pool_group is not None:  # the pool stays shared: later captures must be able to use it
                allocator.end_routing(device, pool_group.handle)
            raise CaptureError(SkipReason(SkipCode.CAPTURE_FAILED, f"{type(exc).__name__}: {exc}")) from exc
        finally:
            current.wait_stream(stream)
    return outputs


def _instantiate(
    graph: Any,
    device: torch.device,
    hooks: Sequence[GraphHook],
    placeholders: Mapping[int, torch.Tensor],
    hook_errors: list[BaseException],
    pristine: int | None,
) -> None:
    """Run ``hooks`` on the captured graph, then instantiate it; ``CaptureError`` when that fails."""
    try:
        with torch.cuda.device(device):  # hooks load modules and instantiate in the graph's context
            if hooks:
                _run_hooks(hooks, int(graph.raw_cuda_graph()), placeholders, hook_errors)
            graph.instantiate()
    except Exception as exc:
        _reset(graph)
        _destroy(pristine)
        raise CaptureError(SkipReason(SkipCode.INSTANTIATE_FAILED, f"{type(exc).__name__}: {exc}")) from exc


def _output_list(outputs: Any) -> tuple[str, list[Any]]:
    """What the callable returned (``"tuple"``, ``"list"`` or ``"single"``) and its outputs as a list."""
    if isinstance(outputs, tuple):
        return "tuple", list(outputs)
    if isinstance(outputs, list):
        return "list", list(outputs)
    return "single", [outputs]


def borrow_blocker(args: Sequence[Any], dynamic_indices: Sequence[int]) -> str:
    """Why a capture may not read the dynamic inputs in place at all (empty when it may)."""
    for i in dynamic_indices:
        if not isinstance(args[i], torch.Tensor):
            return f"input {i} is not a tensor"
    for i in dynamic_indices:
        if not args[i].is_cuda:
            return f"input {i} is not a CUDA tensor"
    return ""


def own_placeholder_inputs(
    args: Sequence[Any], dynamic_indices: Sequence[int], static_indices: Sequence[int]
) -> dict[int, str]:
    """The dynamic inputs a capture on the caller's inputs still reads from placeholders of its own, and
    why: PI tells an input's uses apart by the address range of its storage, and output aliases are
    found by storage, so of two dynamic inputs sharing a storage only the first is read in place, and
    one sharing a static input's storage is never."""
    static_storages = {_storage_ptr(args[i]): i for i in static_indices if isinstance(args[i], torch.Tensor)}
    owner: dict[int, int] = {}
    own: dict[int, str] = {}
    for i in dynamic_indices:
        key = _storage_ptr(args[i])
        if key in static_storages:
            own[i] = f"input {i} shares a storage with static input {static_storages[key]}"
        elif key in owner:
            own[i] = f"inputs {owner[key]} and {i} share a storage"
        else:
            owner[key] = i
    return own


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
