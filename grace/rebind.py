"""Serve a captured graph at other addresses of its static inputs by editing a copy of it (rebinding).

Problem: one compiled callable often serves several modules of one class (a layer body that Dynamo
compiled once after a graph break, called for each layer with that layer's parameters). Its static
inputs (parameters, buffers) then sit at other addresses on every call, and a graph reads them in place.
A capture per address set gives every layer's graph its own pool: its own intermediates and its own
outputs, held for as long as the graph lives (figures in docs/design/runtime.md).

Design: a graph captured for a callable with static inputs keeps a pristine copy of its CUDA graph
(``cuGraphClone`` before any hook edited it, ``CapturedGraph.pristine``). When the static inputs move,
``rebind`` clones that copy, finds every use of each moved input's old storage range in the kernel
nodes' arguments (grace.pi.scan, the scan parameter indirection uses for dynamic inputs), adds the move
to each, runs the hooks a capture runs (PI for a PI graph) and instantiates. The new graph reads the
same placeholders and writes the same intermediates and outputs in the same pool as its origin: the
graphs of one slot share one pool and, where the layers do not hold each other's outputs (Note below),
one set of outputs, whatever the number of layers (up to option ``max_rebinds``).

``rebind`` declines (the runner then captures as before) with a ``CaptureError`` saying why when:
- a moved input's storage changed size, or its data sits at another offset in it;
- the move is not a multiple of ``REBIND_ALIGNMENT`` bytes: kernels were chosen and specialised for
  the old addresses' alignment (Triton's divisibility by 16, cuBLAS's heuristics, TMA descriptors);
- a moved input shares its old storage with another static input that did not move by the same
  distance, or its new storage overlaps what the graph reads for a dynamic input;
- a use is in a memcpy or memset node, in a node type that may hide uses, or in arguments that cannot
  be read;
- the callable draws random numbers: torch's replay advances the generator's offset, a raw launch
  would not.

Invariants:
- a value is edited only where the scan found an address in a moved input's old storage, and becomes
  that address plus the input's move; nothing else of the graph changes;
- a rebound graph replays on the caller's current stream, like torch's replay, after the stream of the
  family's last run (Note: [Stream order] in grace.streams: they share intermediates), and is released with
  ``CapturedGraph.release``, which resets the origin's torch graph (and so frees the pool) with the last
  graph of the family;
- the runner compares a rebound graph's first replays with the no-graph callable (grace.verify), as for
  a captured one; graphs sharing outputs count as one graph for Note: [Outputs held within one call] in
  grace.outputs.

Note: [Layers that hold each other's outputs]
Sharing outputs pays only where a layer's outputs are dead before the next layer's graph replays
(attention scores, a feed-forward's hidden activations). A layer's result that the next layer reads
(the hidden state of a residual stream) or that the model keeps is still held then: a replay would
overwrite it, so that call runs without the graph. The runner does not let that last: a slot whose
graph's output is an input of the call that moved the static inputs captures again instead of
rebinding (``grace.decide.rebind_graph``), and a graph of a family that finds outputs another graph of its
family wrote still held when it replays (counted, or read by this very call) is replaced by a capture of
its own; either stops rebinds for that slot (what this saves on a model: docs/design/runtime.md).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from grace.capture import CapturedGraph, CaptureError, GraphHook, StorageSpan, storage_spans
from grace.compat import cuda as cuda_compat
from grace.cudagraph import ArgumentEdit, KernelNode, edit_kernel_node_arguments
from grace.reasons import SkipCode, SkipReason
from grace.seams import load_seam

REBIND_ALIGNMENT = 256  # bytes: every address a kernel was given keeps its alignment up to this


def _overlap(a: StorageSpan, b: StorageSpan) -> bool:
    return a.start < b.end and b.start < a.end


def moves(
    old: Mapping[int, StorageSpan], new: Mapping[int, StorageSpan], dynamic: Sequence[StorageSpan]
) -> dict[int, int] | str:
    """The move in bytes of each static input that moved, or why the graph cannot follow them.

    ``old``: the static inputs' spans at capture; ``new``: now; ``dynamic``: what the graph reads for its
    dynamic inputs (placeholders, or the capture's own inputs).
    """
    if set(old) != set(new):
        return f"static inputs {sorted(set(old) ^ set(new))} are not tensors in both calls"
    moved: dict[int, int] = {}
    for i in sorted(old):
        before, now = old[i], new[i]
        if before.data_ptr == now.data_ptr:
            continue
        if before.nbytes != now.nbytes:
            return f"static input {i}: its storage has {now.nbytes} bytes, {before.nbytes} at capture"
        if now.data_ptr - now.start != before.data_ptr - before.start:
            return f"static input {i}: its data sits at another offset of its storage"
        delta = now.start - before.start
        if delta % REBIND_ALIGNMENT:
            return f"static input {i} moved by {delta} bytes, not a multiple of {REBIND_ALIGNMENT}"
        moved[i] = delta
    for i, delta in moved.items():
        for j in old:
            if j != i and _overlap(old[i], old[j]) and moved.get(j, 0) != delta:
                return f"static inputs {i} and {j} share storage and did not move together"
        for span in dynamic:
            if _overlap(old[i], span) or _overlap(new[i], span):
                return f"static input {i} overlaps memory the graph reads for a dynamic input"
    return moved


def edits_for(
    nodes: Sequence[KernelNode],
    copy_nodes: Sequence[Any],
    other_node_types: Mapping[int, str],
    old: Mapping[int, StorageSpan],
    moved: Mapping[int, int],
) -> dict[int, list[ArgumentEdit]] | str:
    """The argument edits that make a graph read each moved static input at its new address (node ->
    edits), or why it cannot: a use the scan cannot account for is never left unedited."""
    scan_mod, unavailable = load_seam("pi.scan")
    if scan_mod is None:
        return str(unavailable)
    ranges = [scan_mod.InputRange(i, old[i].data_ptr, old[i].start, old[i].end) for i in sorted(moved)]
    parameterless = [k.node for k in nodes if not k.params and k.extra is None]
    found = scan_mod.scan(nodes, copy_nodes, other_node_types, ranges, parameterless)
    if found.everything_unaccountable:
        return found.everything_unaccountable
    if found.unaccountable:
        index, why = sorted(found.unaccountable.items())[0]
        return f"static input {index}: {why}"
    by_node = {k.node: k for k in nodes}
    edits: dict[int, list[ArgumentEdit]] = {}
    for use in found.uses:
        node = by_node[use.node]
        value = old[use.index].data_ptr + use.delta + moved[use.index]
        param_offset = node.params[use.param_index].offset if use.param_index is not None else 0
        edits.setdefault(use.node, []).append(
            ArgumentEdit(use.param_index, param_offset, use.byte_offset, struct.pack("<Q", value))
        )
    return edits


class RawGraph:
    """An executable graph grace instantiated itself, launched like ``torch.cuda.CUDAGraph.replay``."""

    def __init__(self, graph: int, graph_exec: int, device: torch.device) -> None:
        driver = _pi_part("driver")
        self._graph = graph
        self._exec = graph_exec
        self._device = device
        self._launch = driver.graph_launcher(graph_exec)

    def replay(self) -> None:
        self._launch(int(torch.cuda.current_stream(self._device).cuda_stream))

    def raw_cuda_graph(self) -> int:
        return self._graph

    def raw_cuda_graph_exec(self) -> int:
        return self._exec

    def reset(self) -> None:
        driver = _pi_part("driver")
        graph, graph_exec, self._graph, self._exec = self._graph, self._exec, 0, 0
        if graph:
            driver.graph_destroy(graph, graph_exec)


def _pi_part(name: str) -> Any:
    """``grace.pi.<name>``, whose driver layer and graph scan rebinding shares, reached through the seam
    (grace.seams); ``CaptureError`` (``rebind_declined``) when it cannot be used."""
    module, unavailable = load_seam(f"pi.{name}")
    if module is None:
        raise _declined(str(unavailable))
    return module


def _declined(why: str) -> CaptureError:
    return CaptureError(SkipReason(SkipCode.REBIND_DECLINED, why))


def rebind(
    origin: CapturedGraph,
    args: Sequence[Any],
    hooks: Sequence[GraphHook] = (),
    random_ops: Sequence[str] = (),
) -> CapturedGraph:
    """A graph that does what ``origin`` does with the static inputs at their addresses in ``args``.

    ``hooks`` run on the edited copy before instantiation, with ``origin``'s placeholders, as in a
    capture (a hook that needs the addresses the copy reads for each dynamic input takes
    ``origin.capture_spans``: a graph captured on the caller's inputs has no placeholders). Raises
    ``CaptureError`` (code ``rebind_declined``) when the graph cannot follow the move.
    """
    driver = _pi_part("driver")
    graph_nodes_for_scan = _pi_part("plan").graph_nodes_for_scan
    if origin.origin is not None:
        raise ValueError("rebind from the graph that was captured, not from a rebound one")
    if random_ops:
        raise _declined(f"the graph draws random numbers ({', '.join(random_ops[:3])})")
    if not origin.pristine:
        raise _declined("no copy of the captured graph (this torch does not keep captured graphs)")
    moved = moves(
        origin.static_spans,
        storage_spans(args, origin.static_indices),
        list(origin.capture_spans.values()),
    )
    if isinstance(moved, str):
        raise _declined(moved)
    clone = cuda_compat.graph_clone(origin.pristine)
    try:
        with torch.cuda.device(origin.device):
            nodes, copies, others = graph_nodes_for_scan(clone)
            edits = edits_for(nodes, copies, others, origin.static_spans, moved)
            if isinstance(edits, str):
                raise _declined(edits)
            for node, node_edits in edits.items():
                edit_kernel_node_arguments(node, node_edits)
            for hook in hooks:
                hook(clone, origin.placeholders)
            graph_exec = driver.instantiate(clone)
    except CaptureError:
        cuda_compat.graph_destroy(clone)
        raise
    except Exception as exc:
        cuda_compat.graph_destroy(clone)
        raise _declined(f"{type(exc).__name__}: {exc}") from exc
    return CapturedGraph.rebound_from(origin, RawGraph(clone, graph_exec, origin.device), args)


def moved_static_text(graph: CapturedGraph | None, args: Sequence[Any]) -> str:
    """Which of ``graph``'s static inputs ``args`` moved, for a skip reason."""
    if graph is None:
        return "no graph"
    moved = [i for i in graph.static_indices if args[i].data_ptr() != graph.static_ptrs[i]]
    shown = ", ".join(f"input {i} {tuple(args[i].shape)}" for i in moved[:3])
    more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
    return f"{len(moved)} of {len(graph.static_indices)} static inputs: {shown}{more}"
