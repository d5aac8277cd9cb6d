"""The seam between capture and parameter indirection: what a graph editor sees, and what PI returns.

Problem: PI (grace.pi) edits a captured graph between capture and instantiation and then updates a
pointer table before each replay; the capture and the graph's replay must not depend on how.

Design: a capture hands each ``GraphHook`` the raw graph and its placeholders; PI's hook builds a
``CaptureContext`` and ``grace.pi.prepare(ctx)`` returns an object satisfying ``PIPlan`` (or a
``SkipReason``), which the graph keeps and calls on every replay.

Note: [PI seam] ``grace.pi.prepare(ctx)`` receives a ``CaptureContext`` and returns an object satisfying
``PIPlan`` or a ``SkipReason``. Before each replay the runner calls ``plan.update(inputs)``: True means
the pointer table now points at ``inputs`` for every index not in ``plan.uncovered_indices`` (those are
still copied into their placeholders); False means the plan has pointed every slot at its placeholder and
the runner copies all dynamic inputs this call. A plan of a graph captured on the caller's inputs also
has ``rebase_placeholders(addresses)``: the runner calls it when such a graph first needs placeholders.

Invariant: a hook sees the graph before ``instantiate``: edits made there are in every replay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from grace.placeholders import StorageSpan


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
