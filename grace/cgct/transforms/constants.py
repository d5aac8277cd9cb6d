"""Constant CPU work and CPU factories, put on the GPU.

Problem: ``x * torch.tensor(0.5)``, ``torch.arange(n).to(device)`` and numpy scalars create CPU
tensors inside the graph; one CPU node disables CUDA graphs (before 2.9) or splits the graph (2.9+).

Design: a constant subgraph (planned ``FOLD``: no inputs but constants, deterministic, not mutated,
not returned) is evaluated once, here, on the CPU by the same code the user wrote, and its frontier
values are stored on the graph as GPU attributes (``_cgct_constant_<n>``) read with ``get_attr``.
Values are therefore bit-identical to what the original graph computed, including float ``arange``
whose CPU and GPU kernels differ. A factory whose arguments are symbolic (dynamic shapes; planned
``FACTORY``) cannot be evaluated ahead: its ``device`` keyword is set to the GPU, which the plan
allows only for factories that are exact on every device.

Invariant: a folded constant is never mutated by the graph and never escapes it (the plan checks both;
border copies of it stay copies when needed), so sharing one tensor across calls is unobservable.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx

from grace.cgct.analysis import GraphFacts
from grace.cgct.plan import Action, Plan
from grace.cgct.transforms import example_fake_mode, materialize, nodes_by_name
from grace.compat import dynamo as compat

log = logging.getLogger(__name__)


def _evaluate(node: torch.fx.Node, env: dict[str, Any], facts: GraphFacts, original: torch.fx.Node) -> Any:
    def resolve(arg: torch.fx.Node) -> Any:
        if arg.name in env:
            return env[arg.name]
        return facts[_original_input(original, arg.name)].value

    args = torch.fx.node.map_arg(node.args, resolve)
    kwargs = torch.fx.node.map_arg(node.kwargs, resolve)
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    if node.op == "call_function":
        return node.target(*args, **kwargs)  # type: ignore[operator]
    raise ValueError(f"cannot fold a {node.op} node ({node.name})")


def _original_input(original: torch.fx.Node, name: str) -> torch.fx.Node:
    for arg in original.all_input_nodes:
        if arg.name == name:
            return arg
    raise KeyError(name)


def fold_constants(
    gm: torch.fx.GraphModule,
    original: dict[str, torch.fx.Node],
    relocation: Plan,
    facts: GraphFacts,
    example_inputs: list[Any],
) -> dict[torch.fx.Node, str]:
    """Replace planned constant subgraphs by GPU attributes; returns original frontier node -> note.

    Also records the CPU value of every attribute it creates in ``gm._cgct_constants`` (name ->
    CPU tensor) so that the rewrite can be checked without a GPU (grace.cgct.verify).
    """
    folded = {node.name for node in relocation.nodes(Action.FOLD)}
    if not folded:
        return {}
    fake_mode = example_fake_mode(example_inputs)
    env: dict[str, Any] = {}
    constants: dict[str, torch.Tensor] = dict(getattr(gm, "_cgct_constants", {}))
    fixed: dict[torch.fx.Node, str] = {}
    with compat.no_active_fake_mode(), torch.no_grad():
        for node in list(gm.graph.nodes):
            if node.name not in folded:
                continue
            env[node.name] = _evaluate(node, env, facts, original[node.name])
    for node in list(gm.graph.nodes):
        if node.name not in folded:
            continue
        if all(user.name in folded for user in node.users):
            continue
        value = env[node.name]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"constant {node.name} folded to {type(value).__name__}, not a tensor")
        name = f"_cgct_constant_{len(constants)}"
        placed = materialize(value, relocation.target, fake_mode)
        setattr(gm, name, placed)
        constants[name] = value
        with gm.graph.inserting_before(node):
            attribute = gm.graph.create_node("get_attr", name)
        attribute.meta = dict(node.meta)
        old = compat.node_value(node)
        if isinstance(old, torch.Tensor) and compat.is_fake(old):
            # Tensor.to makes an expanded (overlapping) value contiguous: describe what is stored.
            compat.set_node_value(attribute, compat.fake_like(old, placed))
        node.replace_all_uses_with(attribute)
        fixed[original[node.name]] = (
            f"constant computed once on the CPU at compile time and kept on {relocation.target}"
        )
    for node in reversed(list(gm.graph.nodes)):
        if node.name in folded and not node.users:
            gm.graph.erase_node(node)
    gm._cgct_constants = constants  # type: ignore[assignment]
    log.debug("folded %d constant CPU nodes into %d GPU constants", len(folded), len(fixed))
    return fixed


def place_factories(
    gm: torch.fx.GraphModule, original: dict[str, torch.fx.Node], relocation: Plan
) -> dict[torch.fx.Node, str]:
    """Give planned factories ``device=<target>``; returns original node -> note."""
    nodes = nodes_by_name(gm)
    fixed: dict[torch.fx.Node, str] = {}
    for planned in relocation.nodes(Action.FACTORY):
        node = nodes[planned.name]
        kwargs = dict(node.kwargs)
        kwargs["device"] = relocation.target
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        node.kwargs = kwargs
        fixed[original[node.name]] = f"created directly on {relocation.target}"
    return fixed
