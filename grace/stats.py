"""Per-graph facts of the grace runtime, for users, ``grace.explain`` and the suites.

Problem: whether grace helped is only visible in numbers: how many kernels sit in a graph, how many
graph and kernel launches one call costs, how many bytes each replay copies, which variant SCG chose and
the medians behind that choice, and why a graph was declined.

Design: one ``GraphStats`` record per (compiled callable, input signature), created by the runner and
kept in a process-wide registry. The runner updates plain counters on its hot path (an integer add);
``snapshot()`` derives the per-call figures and returns JSON-ready dicts with documented keys;
``fallback_counts()`` counts skip reasons by code. ``reset()`` (called by ``grace.reset``) zeroes the call
counters of live slots, forgets released slots and the fallback counts, so a suite can measure one
phase; ``forget_all()`` drops every record (tests start from an empty registry).

Invariant: a snapshot is a copy: callers may keep or change it without touching the live records.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from grace.reasons import SkipReason
from grace.scg import Decision, Variant, uses_graph


@dataclass
class GraphStats:
    """Live record of one graph slot (one callable, one input signature)."""

    graph_id: str
    callable_id: int
    graph_hash: str
    signature: str
    device: str
    variant: Variant = Variant.PENDING
    kernel_nodes: int | None = None
    launch_nodes: int | None = None  # kernel, memset and memcpy nodes: launches a no-graph call makes
    node_types: dict[str, int] = field(default_factory=dict)
    copy_bytes_per_replay: int = 0
    copy_launches_per_replay: int = 0
    pi_bytes_per_replay: int | None = None
    pi_stages: list[tuple[str, str, str]] = field(default_factory=list)
    decision: Decision | None = None
    skip_reasons: list[SkipReason] = field(default_factory=list)
    calls: int = 0
    graph_calls: int = 0
    copy_fallback_calls: int = 0
    held_output_calls: int = 0  # calls run without the graph: its outputs were held (Note: [Outputs held...])
    graphs_held: int = 0  # graphs the slot keeps (one per static-input address set)
    output_bytes_held: int = 0  # bytes of their outputs in their pools, allocated while they live
    recaptures: int = 0
    rebinds: int = 0  # graphs made for moved static inputs by editing a copy (grace.rebind)
    # Why the sets a call found taken were taken, counted per reason, when it made another output set or
    # had none left (Note: [Output sets] in grace.outputsets)
    set_blocks: dict[str, int] = field(default_factory=dict)
    released: bool = False

    def note_set_blocks(self, reasons: Iterable[str | None]) -> None:
        for reason in reasons:
            key = reason or "free"
            self.set_blocks[key] = self.set_blocks.get(key, 0) + 1

    def add_skip(self, reason: SkipReason) -> None:
        if reason not in self.skip_reasons:
            self.skip_reasons.append(reason)
        _count_fallback(reason)

    def kernel_launches_per_call(self) -> int | None:
        """Launches (kernels, memsets, memcpys) outside any graph in one steady-state call."""
        if not uses_graph(self.variant):
            return self.launch_nodes
        return self.copy_launches_per_replay

    def graph_launches_per_call(self) -> float:
        if self.calls == 0:
            return 0.0
        return self.graph_calls / self.calls

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph_id": self.graph_id,
            "callable_id": self.callable_id,
            "graph_hash": self.graph_hash,
            "signature": self.signature,
            "device": self.device,
            "variant": self.variant.value,
            "kernel_nodes": self.kernel_nodes,
            "node_types": dict(self.node_types),
            "calls": self.calls,
            "graph_launches": self.graph_calls,
            "graph_launches_per_call": self.graph_launches_per_call(),
            "steady_graph_launches_per_call": 1 if uses_graph(self.variant) else 0,
            "kernel_launches_per_call": self.kernel_launches_per_call(),
            "copy_bytes_per_replay": self.copy_bytes_per_replay if uses_graph(self.variant) else 0,
            "pi_bytes_per_replay": self.pi_bytes_per_replay,
            "pi_stages": [list(s) for s in self.pi_stages],
            "copy_fallback_calls": self.copy_fallback_calls,
            "held_output_calls": self.held_output_calls,
            "graphs_held": self.graphs_held,
            "output_bytes_held": self.output_bytes_held,
            "recaptures": self.recaptures,
            "rebinds": self.rebinds,
            "set_blocks": dict(self.set_blocks),
            "decision": self.decision.to_dict() if self.decision is not None else None,
            "skip_reasons": [r.to_dict() for r in self.skip_reasons],
            "released": self.released,
        }


_lock = threading.Lock()
_records: dict[str, GraphStats] = {}
_fallbacks: Counter[str] = Counter()
_next_id = 0


def new_record(
    callable_id: int, graph_hash: str, signature: str, device: str, variant: Variant = Variant.PENDING
) -> GraphStats:
    """Create and register the record of a new graph slot (``variant``: ``no_graph`` for a callable that
    gets no slots; a slot writes its own from then on)."""
    global _next_id
    with _lock:
        _next_id += 1
        record = GraphStats(
            graph_id=f"g{callable_id}.{_next_id}",
            callable_id=callable_id,
            graph_hash=graph_hash,
            signature=signature,
            device=device,
            variant=variant,
        )
        _records[record.graph_id] = record
    return record


def _count_fallback(reason: SkipReason) -> None:
    with _lock:
        _fallbacks[reason.code.value] += 1


def snapshot() -> list[dict[str, Any]]:
    """One dict per graph slot seen since the last ``reset()``.

    Keys: graph_id, callable_id, graph_hash, signature, device, variant (``no_graph``, ``graph_copies``,
    ``graph_pi``, ``pending``), kernel_nodes (None when unknown), node_types, calls, graph_launches,
    graph_launches_per_call (over all calls, warm-up included), steady_graph_launches_per_call,
    kernel_launches_per_call (launches outside graphs in a steady call), copy_bytes_per_replay,
    pi_bytes_per_replay, pi_stages, copy_fallback_calls, held_output_calls (calls run without the graph
    because a replay would have overwritten outputs held within one compiled call or by another thread's
    call), graphs_held and
    output_bytes_held (the slot's live graphs and the bytes of their outputs), recaptures and rebinds
    (graphs captured, and graphs edited from a copy, for static inputs at new addresses), set_blocks
    (why the output sets a call found taken were taken, per reason), decision
    (variant, source, medians_ms, samples, key, numeric checks), skip_reasons (code, detail), released.
    """
    with _lock:
        records = list(_records.values())
    return [r.to_dict() for r in records]


def pools_waiting() -> int:
    """Memory pools of released graphs kept because the caller still holds outputs of them (grace.pools);
    each is released at the first call after the last of those outputs is dropped."""
    from grace import pools

    return pools.waiting()


def fallback_counts() -> dict[str, int]:
    """How often each skip reason code was recorded since the last ``reset()``."""
    with _lock:
        return dict(_fallbacks)


def reset() -> None:
    """Zero the call counters of live graph slots, forget released ones and the fallback counts.

    Facts about live graphs (variant, decision, kernel counts, skip reasons) stay: they still hold.
    """
    with _lock:
        for key in [k for k, r in _records.items() if r.released]:
            del _records[key]
        for record in _records.values():
            record.calls = 0
            record.graph_calls = 0
            record.copy_fallback_calls = 0
            record.held_output_calls = 0
        _fallbacks.clear()


def forget_all() -> None:
    """Drop every record and the fallback counts (``grace.reset`` calls ``reset`` instead)."""
    with _lock:
        _records.clear()
        _fallbacks.clear()
