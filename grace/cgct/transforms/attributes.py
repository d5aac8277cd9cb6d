"""CPU module attributes (parameters, buffers, plain tensors, lists of tensors, globals) read by the
graph from a GPU mirror that grace owns.

Problem: a detection model's anchors buffer, a lookup table or a frozen parameter left on the CPU is
read by every call and copied to the GPU inside the graph, which then cannot be captured whole. The
user's objects must not change because of grace: code that runs in eager (``lut.numpy()``,
``.item()`` on the attribute, device checks) must keep running after compiling.

Design: the attribute stays where it is, with its identity, device, dtype and values. The graph gets
a GPU copy instead: an input the adapter swaps in (for a placeholder, the attribute Dynamo passes on
each call), or a non-persistent buffer of the graph module (for a ``get_attr`` node). Before every
call, ``grace.cgct.adapter.MirrorStep`` makes the mirror equal to the attribute as it is then,
including writes no version counter records (Note: [Writes a version counter does not show] in
grace.cgct.adapter). No retrace is needed: Dynamo's guards still see the CPU attribute they traced,
so a moved or replaced attribute recompiles or refreshes the mirror as it would without grace.

Invariants: the user's tensors are never written, moved or re-pointed; the plan never hands over
attributes the graph mutates or returns, or ones whose bytes a mirror cannot compare
(``mirror_unsupported``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx

from grace.cgct.adapter import MirrorStep, MirrorSync
from grace.cgct.plan import Action, Plan
from grace.cgct.transforms import example_fake_mode, materialize, nodes_by_name
from grace.compat import dynamo as compat

log = logging.getLogger(__name__)


def _attribute_tensor(gm: torch.fx.GraphModule, node: torch.fx.Node, inputs: list[Any]) -> Any:
    if node.op == "placeholder":
        index = [n for n in gm.graph.nodes if n.op == "placeholder"].index(node)
        return inputs[index]
    owner: Any = gm
    for part in str(node.target).split("."):
        owner = getattr(owner, part)
    return owner


def _source_name(node: torch.fx.Node) -> str:
    if node.op == "get_attr":
        return f"graph attribute {node.target}"
    return compat.placeholder_source_name(node) or node.name


def mirror_attributes(
    gm: torch.fx.GraphModule,
    original: dict[str, torch.fx.Node],
    relocation: Plan,
    example_inputs: list[Any],
) -> tuple[list[MirrorStep], dict[torch.fx.Node, str]]:
    """GPU mirrors for planned attributes; returns adapter steps and original node -> note."""
    fake_mode = example_fake_mode(example_inputs)
    nodes = nodes_by_name(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    steps: list[MirrorStep] = []
    fixed: dict[torch.fx.Node, str] = {}
    mirrors: dict[str, torch.Tensor] = dict(getattr(gm, "_cgct_mirrors", {}))
    for planned in relocation.nodes(Action.ATTRIBUTE):
        node = nodes[planned.name]
        tensor = _attribute_tensor(gm, node, example_inputs)
        with torch.no_grad():
            mirror = materialize(tensor.detach(), relocation.target, fake_mode)
        if node.op == "placeholder":
            step = MirrorStep(source=tensor, mirror=mirror, index=placeholders.index(node))
            compat.mark_static_input(node, mirror)
        else:
            name = f"_cgct_mirror_{len(mirrors)}"
            # A buffer, not a plain attribute: AOTAutograd lifts buffers into its fake trace (a plain
            # tensor attribute reaches it as a real tensor and stops Inductor's compile).
            gm.register_buffer(name, mirror, persistent=False)
            mirrors[name] = tensor
            node.target = name
            step = MirrorStep(source=tensor, mirror=mirror, index=None)
        steps.append(step)
        how = (
            "copied again on every call (too large to compare on every call)"
            if step.sync is MirrorSync.EVERY_CALL
            else "compared with it before every call and copied again when it changed"
        )
        fixed[original[planned.name]] = (
            f"{_source_name(node)} stays on the CPU; the graph reads a mirror on {relocation.target}, {how}"
        )
    gm._cgct_mirrors = mirrors  # type: ignore[assignment]
    return steps, fixed
