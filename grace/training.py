"""Training under grace: AOTAutograd's forward and backward graphs, each run by a grace runner.

Problem: for a Dynamo graph that needs autograd, ``compile_fx`` returns AOTAutograd's
``autograd.Function``, whose forward and backward each call one Inductor-compiled graph. A CUDA graph
around that Function would have to capture autograd itself; the graphs inside it are plain launches,
but what they return lives on past the call: the forward's saved tensors until its backward runs, the
backward's gradients as parameters' ``.grad``.

Design: the backend's runner for such a graph takes no CUDA graph (``SkipCode.AUTOGRAD``); instead its
inner-compile hook (``TrainingGraphs``, given to ``grace.compat.torch.compile_with_inductor``) receives
each graph Inductor makes (``grace.compat.aot.InnerGraph``) and installs, in its ``OutputCode``, an
entry that calls a guarded runner built by the backend for that graph (``InnerRunnerFactory``), with
the same slots, variants, PI, SCG and checks as any graph. What differs is stated in ``InnerFacts``:
- static inputs: a forward's are the ones Inductor was told of (parameters and buffers, as Dynamo
  marked them); a backward has none. Its saved tensors sit where the forward's replay wrote them, which
  PI follows at no cost while they stay there, and a copy or PI follows when they do not (a forward that
  ran without its graph), with no recapture;
- kept outputs (Note: [Outputs autograd keeps] in grace.outputs): a forward's from its first saved
  tensor on (``InnerGraph.caller_outputs``), a backward's all of them;
- written inputs: AOTAutograd's donated buffers (a backward reusing its saved tensors' memory) are off
  while grace compiles; where a backward still has some, they count as inputs it mutates, so the
  runtime's rule for such graphs (Note: [Slot states] in grace.runner) covers them;
- the rule for saved tensors: a forward never replays over saved tensors that a pending backward still
  needs (they are kept outputs, so that call runs without the graph, in fresh memory, as Inductor alone
  would); a backward never replays over gradients something still holds.
- Philox seeds (Note: [Philox seeds of attention] in grace.philox): an attention forward's seed
  outputs may sit on another device in a replay than in a plain run, and the backward's plain runs get
  host copies of device seeds;
- the calling convention: AOTAutograd passes a list that the callee empties (so that saved tensors can
  be freed early); the entry moves it into the ``Inputs`` the runner gets, which a run without a graph
  hands on to Inductor's code (grace.boxing).

Invariant: an inner graph that grace cannot run keeps Inductor's own entry, and every failure of an
installed runner falls back to that entry for the rest of the process (grace.guard).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from grace import philox
from grace.boxing import Consuming, Inputs, RunsInputs
from grace.compat.aot import GraphRole, InnerGraph

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InnerFacts:
    """What a training graph's runner is told beyond what the analysis of its graph finds."""

    role: GraphRole
    static_indices: tuple[int, ...]
    dynamic_indices: tuple[int, ...]
    kept_from: int | None
    seed_inputs: tuple[int, ...] = ()  # Note: [Philox seeds of attention] in grace.philox
    seed_outputs: tuple[int, ...] = ()
    undefined_outputs: tuple[int, ...] = ()  # Note: [Random state of an op that draws nothing]


def inner_facts(inner: InnerGraph) -> InnerFacts:
    """Static and dynamic tensor inputs and the first kept output of ``inner`` (module docstring)."""
    tensors = [i for i, v in enumerate(inner.example_inputs) if isinstance(v, torch.Tensor)]
    seeds_in, seeds_out = philox.seed_inputs(inner.gm), philox.seed_outputs(inner.gm)
    undefined = philox.undefined_outputs(inner.gm)
    if inner.role is GraphRole.BACKWARD:
        return InnerFacts(inner.role, (), tuple(tensors), 0, seeds_in, seeds_out, undefined)
    marked = set(inner.static_input_idxs)
    static = tuple(i for i in tensors if i in marked)
    dynamic = tuple(i for i in tensors if i not in marked)
    kept_from = inner.caller_outputs if inner.role is GraphRole.FORWARD else None
    return InnerFacts(inner.role, static, dynamic, kept_from, seeds_in, seeds_out, undefined)


def unboxed(compiled: Callable[[list[Any]], Any]) -> Consuming:
    """``compiled`` (list in, emptied) as a callable of positional inputs, as runners call graphs, that
    also takes the call's ``Inputs`` (grace.boxing)."""
    return Consuming(compiled)


def boxed(runner: RunsInputs) -> Callable[[list[Any]], Any]:
    """``runner`` as an entry AOTAutograd calls with a list, which it empties (module docstring): the
    inputs move into an ``Inputs`` that a run without a graph hands on to Inductor's code (grace.boxing),
    and that is emptied when the call ends."""

    def entry(inputs: list[Any]) -> Any:
        args = Inputs(inputs)
        inputs.clear()
        try:
            return runner.run(args)
        finally:
            args.clear()

    return entry


InnerRunnerFactory = Callable[[InnerGraph, InnerFacts, Consuming], RunsInputs]
"""Builds the guarded runner of one training graph from its entry, a callable of positional inputs that
also takes the call's ``Inputs`` (the backend's ``_inner_runner``)."""


class TrainingGraphs:
    """The inner-compile hook for one Dynamo graph that needs autograd (module docstring)."""

    def __init__(self, build: InnerRunnerFactory) -> None:
        self.build = build
        self.installed: list[GraphRole] = []

    def __call__(self, inner: InnerGraph) -> None:
        try:
            facts = inner_facts(inner)
            runner = self.build(inner, facts, unboxed(inner.compiled))
        except Exception:  # Note: [The backend never raises for its own failures] in grace.backend
            logger.debug("grace: building a runner for a %s graph failed", inner.role.value, exc_info=True)
            return
        inner.install(boxed(runner))
        self.installed.append(inner.role)
