"""AOTAutograd's graphs as Inductor's inner compile sees them, exposed as capabilities.

Problem: for a graph that needs autograd, Dynamo's backend gets one callable back from ``compile_fx``:
AOTAutograd's ``autograd.Function``, whose forward and backward each call an Inductor-compiled graph.
Those two graphs are where CUDA graphs belong in training; only the inner compile sees them, and what it
sees (its keywords, the ``OutputCode`` it returns, AOTAutograd's metadata) is private and moves between
releases.

Design: ``InnerGraph`` is one inner compile's result as grace needs it: its role (inference, forward,
backward), the FX graph and example inputs, the static inputs Inductor was told of, how many of a
forward's outputs go back to the caller (the rest are saved for the backward), and the ``OutputCode``,
whose ``current_callable`` (list in, outputs out; the list is consumed) ``install`` replaces. Facts relied
on (read in torch 2.4-2.13, run on 2.11):
- the inner compile gets ``is_inference`` and ``is_backward`` keywords; a forward's outputs are
  ``[effect tokens] mutated inputs, user outputs, intermediate bases, [rng offset], saved tensors,
  saved symints`` and ``TracingContext.fw_metadata.num_forward_returns`` counts the first three groups;
- ``OutputCode.__call__(inputs)`` calls ``self.current_callable(inputs)``; ``post_compile`` (input
  alignment) has wrapped ``current_callable`` by the time the inner compile returns;
- after a backward (without ``retain_graph``) AOTAutograd drops the saved tensors from the context;
- with ``donated_buffer`` on, a backward may write into the memory of the saved tensors listed in
  ``fw_metadata.bw_donated_idxs``, which no op of its graph shows.

Invariant: where a fact cannot be read, the answer is the cautious one: every output of a forward
counts as saved for the backward (``caller_outputs`` 0).
"""

from __future__ import annotations

import enum
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


class GraphRole(enum.Enum):
    """Which graph of a compiled callable an inner compile made."""

    INFERENCE = "inference"
    FORWARD = "forward"
    BACKWARD = "backward"


@dataclass(frozen=True)
class InnerGraph:
    """One inner compile's result (see the module docstring)."""

    role: GraphRole
    gm: torch.fx.GraphModule
    example_inputs: tuple[Any, ...]
    static_input_idxs: tuple[int, ...]
    caller_outputs: int  # a forward's outputs before its saved tensors; 0 where unknown or a backward
    output_code: Any
    donated: tuple[int, ...] = ()  # a backward's inputs whose memory it may reuse (donated buffers)

    @property
    def compiled(self) -> Callable[[list[Any]], Any]:
        """The generated code's entry: takes the inputs as a list, which it empties."""
        fn: Callable[[list[Any]], Any] = self.output_code.current_callable
        return fn

    def code_view(self) -> Any:
        """An object that reads as the ``OutputCode`` with its entry as it is now (for finding the
        generated module's kernels after ``install`` replaced the entry)."""
        return types.SimpleNamespace(current_callable=self.compiled)

    def install(self, entry: Callable[[list[Any]], Any]) -> None:
        """Make ``entry`` what AOTAutograd's calls of this graph run."""
        self.output_code.current_callable = entry


def can_install(output_code: Any) -> bool:
    """Whether ``output_code`` runs through a replaceable ``current_callable`` (Inductor's compiled
    graphs do; AOT-compiled libraries and graph-module fallbacks do not)."""
    return callable(getattr(output_code, "current_callable", None))


def role_of(kwargs: Mapping[str, Any]) -> GraphRole:
    if kwargs.get("is_backward", False):
        return GraphRole.BACKWARD
    if kwargs.get("is_inference", False):
        return GraphRole.INFERENCE
    return GraphRole.FORWARD


def _forward_metadata() -> Any:
    """AOTAutograd's ``fw_metadata`` of the graph being compiled, or None."""
    try:
        from torch._guards import TracingContext

        context = TracingContext.try_get()
        return getattr(context, "fw_metadata", None) if context is not None else None
    except Exception:
        return None


def forward_returns() -> int:
    """How many of the forward graph's first outputs AOTAutograd hands back (not saved), or 0."""
    count = getattr(_forward_metadata(), "num_forward_returns", None)
    return int(count) if isinstance(count, int) and count >= 0 else 0


def donated_inputs() -> tuple[int, ...]:
    """Inputs of the backward being compiled whose memory it may reuse (AOTAutograd's donated buffers)."""
    found = getattr(_forward_metadata(), "bw_donated_idxs", None) or ()
    try:
        return tuple(int(i) for i in found)
    except (TypeError, ValueError):
        return ()


def inner_graph(args: Sequence[Any], kwargs: Mapping[str, Any], output_code: Any) -> InnerGraph | None:
    """The ``InnerGraph`` of one inner compile call ``(gm, example_inputs, **kwargs)``, or None when its
    result cannot be run through grace (see ``can_install``)."""
    if len(args) < 2 or not isinstance(args[0], torch.fx.GraphModule) or not can_install(output_code):
        return None
    role = role_of(kwargs)
    return InnerGraph(
        role=role,
        gm=args[0],
        example_inputs=tuple(args[1]),
        static_input_idxs=tuple(int(i) for i in (kwargs.get("static_input_idxs") or ())),
        caller_outputs=forward_returns() if role is GraphRole.FORWARD else 0,
        output_code=output_code,
        donated=donated_inputs() if role is GraphRole.BACKWARD else (),
    )
