"""CPU inputs copied to the GPU in front of the graph instead of inside it.

Problem: ``x.to(device)`` of a CPU input inside the graph is a host-to-device copy that Inductor
cannot capture (a CPU node before 2.9, a partition boundary after).

Design: a CPU input whose every use ends on the GPU (planned ``HOIST``) is copied by the input
adapter (``HoistStep``) before each call; inside the graph its placeholder becomes a GPU tensor, the
exact CPU ops between it and the copy follow it to the GPU, and the copy itself becomes a no-op
(grace.cgct.transforms.border). The example input is adapted the same way, so the compiled graph
sees the strides ``Tensor.to`` really produces.

Invariant: placeholders keep their count and order, so Dynamo's calling convention is unchanged; the
copy reads the input of the current call, never a cached one.
"""

from __future__ import annotations

import torch
import torch.fx

from grace.cgct.adapter import HoistStep
from grace.cgct.plan import Action, Plan
from grace.cgct.transforms import nodes_by_name


def hoist_inputs(
    gm: torch.fx.GraphModule, original: dict[str, torch.fx.Node], relocation: Plan
) -> tuple[list[HoistStep], dict[torch.fx.Node, str]]:
    """Adapter steps for planned CPU inputs; returns the steps and original node -> note."""
    hoisted = {node.name for node in relocation.nodes(Action.HOIST)}
    steps: list[HoistStep] = []
    fixed: dict[torch.fx.Node, str] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    nodes = nodes_by_name(gm)
    for index, node in enumerate(placeholders):
        if node.name in hoisted:
            steps.append(HoistStep(index=index, device=relocation.target))
            fixed[original[nodes[node.name].name]] = (
                f"host-to-device copy of this input done in front of the graph ({relocation.target})"
            )
    return steps, fixed
