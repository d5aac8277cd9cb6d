"""``transform``: the CGCT entry point the grace backend calls with each Dynamo graph.

Problem: make a graph capturable whole where Inductor would refuse or split it, without changing what
it computes, and say precisely what was done and what was left.

Design: analyse (fake run) -> plan (which CPU nodes move) -> on a clone of the graph: fold
constants, place factories, hoist inputs, mirror attributes (the user's tensors stay as they are,
grace.cgct.transforms.attributes), settle the border, fix metadata ->
check the result by analysing it again. The check compares every output's device, shape and dtype
with the original's and requires that no CPU node remains except the ones the plan kept; if it
fails, or any step raises, the original graph is returned untouched with a ``transform_rejected``
diagnosis. Nothing here falls back silently.

Invariants: the caller's graph module and the user's tensors are never modified (CGCT works on a
clone and mirrors attributes); the result's example inputs are the adapter applied to the given ones,
so they match the transformed graph's placeholders.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from grace.cgct.adapter import InputAdapter, Step
from grace.cgct.analysis import GraphFacts, analyze
from grace.cgct.diagnose import collect, target_device
from grace.cgct.plan import Plan, plan
from grace.cgct.reasons import Diagnosis, Effect, ReasonCode
from grace.cgct.transforms.attributes import mirror_attributes
from grace.cgct.transforms.border import retarget_metadata, settle_border
from grace.cgct.transforms.constants import fold_constants, place_factories
from grace.cgct.transforms.inputs import hoist_inputs
from grace.compat import dynamo as compat

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CGCTResult:
    """What the backend compiles: ``gm`` called with ``input_adapter(real_inputs)`` (when set)."""

    gm: torch.fx.GraphModule
    example_inputs: list[Any]
    input_adapter: InputAdapter | None
    diagnoses: list[Diagnosis]

    @property
    def changed(self) -> bool:
        return any(d.transformed for d in self.diagnoses)


def transform(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CGCTResult:
    """Rewrite ``gm`` so that CPU work that only feeds the GPU runs on the GPU or before the graph."""
    inputs = list(example_inputs)
    try:
        facts = analyze(gm, inputs)
    except Exception as error:  # analysis must never break compilation
        log.warning("CGCT could not analyse graph: %s", error)
        return CGCTResult(gm, inputs, None, [_rejected(gm, f"analysis failed: {error}")])
    target = target_device(facts)
    if target is None:
        return CGCTResult(gm, inputs, None, collect(gm, inputs, facts))
    relocation = plan(gm, facts, target, inputs)
    if not relocation.actions:
        return CGCTResult(gm, inputs, None, collect(gm, inputs, facts, relocation))

    try:
        clone, adapter, fixed = _rewrite(gm, relocation, facts, inputs)
        new_inputs = adapter.apply(inputs) if adapter is not None else inputs
        for before, after in zip(inputs, new_inputs, strict=True):
            if after is not before and isinstance(after, torch.Tensor):
                compat.adopt_example_context(after, before)
        problem = _check(gm, facts, relocation, clone, new_inputs)
    except Exception as error:  # a failed rewrite keeps the original graph, with the reason
        log.warning("CGCT rewrite failed, keeping the original graph: %s", error, exc_info=True)
        problem = f"rewrite failed: {type(error).__name__}: {error}"
    if problem:
        diagnoses = [*collect(gm, inputs, facts, relocation), _rejected(gm, problem)]
        return CGCTResult(gm, inputs, None, diagnoses)
    diagnoses = collect(gm, inputs, facts, relocation, fixed)
    for diagnosis in diagnoses:
        log.debug("CGCT: %s", diagnosis.describe())
    return CGCTResult(clone, new_inputs, adapter, diagnoses)


def _rewrite(
    gm: torch.fx.GraphModule, relocation: Plan, facts: GraphFacts, inputs: list[Any]
) -> tuple[torch.fx.GraphModule, InputAdapter | None, dict[torch.fx.Node, str]]:
    clone = compat.clone_graph_module(gm)
    original = {node.name: node for node in gm.graph.nodes}
    fixed: dict[torch.fx.Node, str] = {}
    fixed.update(fold_constants(clone, original, relocation, facts, inputs))
    fixed.update(place_factories(clone, original, relocation))
    hoist_steps, hoisted = hoist_inputs(clone, original, relocation)
    fixed.update(hoisted)
    mirror_steps, mirrored = mirror_attributes(clone, original, relocation, inputs)
    fixed.update(mirrored)
    settle_border(clone, relocation, facts)
    retarget_metadata(clone, relocation)
    clone.graph.lint()
    clone.recompile()
    steps: list[Step] = [*hoist_steps, *mirror_steps]
    return clone, (InputAdapter(steps) if steps else None), fixed


def _check(
    gm: torch.fx.GraphModule,
    facts: GraphFacts,
    relocation: Plan,
    clone: torch.fx.GraphModule,
    new_inputs: list[Any],
) -> str:
    """'' when the rewrite keeps every output and leaves only planned CPU nodes, else the problem."""
    after = analyze(clone, new_inputs)
    before_outputs = facts.output_signature()
    after_outputs = after.output_signature()
    if before_outputs != after_outputs:
        return f"outputs changed from {before_outputs} to {after_outputs}"
    kept = {node.name for node in relocation.blocked}
    stray = [
        node.name
        for node, record in after.nodes.items()
        if node.op != "output" and record.on_cpu and node.name not in kept
    ]
    if stray:
        return f"CPU nodes remain that the plan moved: {', '.join(stray)}"
    return ""


def _rejected(gm: torch.fx.GraphModule, problem: str) -> Diagnosis:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return Diagnosis(
        code=ReasonCode.TRANSFORM_REJECTED,
        node=output.name,
        source="",
        message=f"CGCT kept the original graph: {problem}",
        transformed=False,
        effect=Effect.NONE,
    )
