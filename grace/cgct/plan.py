"""Decide which CPU nodes of a graph can move to the GPU without changing what the user's code computes.

Problem: a CPU node anywhere in a graph disables CUDA graphs (before 2.9) or splits the graph into
partitions (2.9+). Many CPU nodes exist only to feed the GPU: a scalar ``torch.tensor(0.5)``
multiplied into a CUDA tensor, ``torch.arange(n)`` copied with ``.to(device)``, an anchors buffer
left on the CPU. Others must stay: a CPU result the graph returns, a value the host reads
(``.item()``), random numbers (the GPU generator draws different ones), float arithmetic (CPU and GPU
round differently).

Design: every CPU node gets a candidate action from what it is (constant subgraph, factory with
symbolic arguments, exact op, user input, module attribute). A greatest fixed point then drops every
candidate that has a consumer the move would change: the graph output, a host read, a CPU op that
stays. What survives is exactly the set of CPU nodes whose every use ends on the target GPU; the
copies at that border (``.to(device)`` of a moved value) become no-ops.

Invariants: a planned graph returns outputs on the same devices with the same dtypes and shapes;
only ops in ``grace.cgct.ops`` exact tables run on the GPU instead of the CPU; constants are computed
by the same CPU code as before and copied once. Note [Aliasing at the border]: a border copy of a
shared tensor (a mirrored attribute, a folded constant) would alias it once the copy is a no-op, so it
stays a real copy (a clone) when its result is mutated or returned.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from grace.cgct import ops
from grace.cgct.adapter import mirror_unsupported
from grace.cgct.analysis import GraphFacts, NodeFacts
from grace.compat import dynamo as compat


class Action(str, enum.Enum):
    FOLD = "fold"
    """Constant subgraph: computed once on the CPU at compile time and kept on the GPU."""
    FACTORY = "factory"
    """Factory call with symbolic arguments: its ``device`` keyword is set to the GPU."""
    FOLLOW = "follow"
    """Exact op whose inputs all move: runs where its inputs are, unchanged."""
    HOIST = "hoist"
    """A CPU input of the graph: copied to the GPU by the input adapter before each call."""
    ATTRIBUTE = "attribute"
    """A CPU module attribute: left on the CPU; the graph reads a GPU mirror kept equal to it."""


@dataclass
class Plan:
    target: torch.device
    actions: dict[torch.fx.Node, Action] = field(default_factory=dict)
    border_copies: dict[torch.fx.Node, bool] = field(default_factory=dict)
    """H2D copies of moved values -> whether they must stay real copies (Note [Aliasing at the border])."""
    blocked: dict[torch.fx.Node, str] = field(default_factory=dict)
    """CPU nodes that stay on the CPU -> why."""

    def nodes(self, action: Action) -> list[torch.fx.Node]:
        return [node for node, chosen in self.actions.items() if chosen is action]


def _is_metadata_only(facts: NodeFacts) -> bool:
    if facts.tensor_outputs:
        return False
    return all(ops.op_name(op) in ops.EXACT_ANY_DTYPE for op in facts.ops) and not any(
        ops.is_sync(op) for op in facts.ops
    )


def _is_copy_to(facts: NodeFacts, target: torch.device) -> bool:
    return (
        facts.devices == frozenset({target})
        and bool(facts.input_devices)
        and all(ops.op_name(op) in ops.COPY_OPS for op in facts.ops)
    )


def _is_copy_to_cpu(facts: NodeFacts) -> bool:
    return (
        facts.on_cpu
        and any(d.type != "cpu" for d in facts.input_devices)
        and all(ops.op_name(op) in ops.COPY_OPS for op in facts.ops)
    )


def _example_for(node: torch.fx.Node, placeholders: list[torch.fx.Node], inputs: Sequence[Any]) -> Any:
    index = placeholders.index(node)
    return inputs[index] if index < len(inputs) else compat.node_value(node)


def _attribute_tensor(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Any:
    owner: Any = gm
    for part in str(node.target).split("."):
        owner = getattr(owner, part)
    return owner


def _initial_action(
    gm: torch.fx.GraphModule,
    node: torch.fx.Node,
    facts: GraphFacts,
    example: Any,
    decided: dict[torch.fx.Node, Action],
) -> Action | str:
    """The action a CPU node could take, or the reason it cannot move.

    Nodes are visited in graph (topological) order; ``decided`` holds the actions of earlier nodes.
    """
    record = facts[node]
    if node.op in ("placeholder", "get_attr"):
        if not isinstance(example, torch.Tensor):
            return "not a tensor"
        attribute = node.op == "get_attr" or compat.is_attribute_source(compat.placeholder_source_name(node))
        if not attribute:
            return Action.HOIST
        if example.requires_grad:
            return (
                "CPU parameter that requires grad: moving it would leave its optimizer state on the "
                "CPU; move the model to the GPU"
            )
        if record.mutated_later:
            return "the graph updates this CPU attribute in place"
        why_not = mirror_unsupported(example)
        if why_not:
            return f"no GPU mirror can follow this CPU attribute: {why_not}"
        return Action.ATTRIBUTE
    if not record.ran:
        return f"could not be analysed ({record.error})"
    if any(d.type != "cpu" for d in record.devices):
        return "produces tensors on several devices"
    if _is_copy_to_cpu(record):
        return "copies a GPU tensor to the CPU: the host needs the value"
    if any(ops.is_sync(op) for op in record.ops):
        return "reads a tensor value on the host"
    if node.op == "call_method" and node.target in ops.SYNC_METHODS:
        return "reads a tensor value on the host"
    if any(ops.is_random(op) for op in record.ops):
        return "draws random numbers: the GPU generator would give different values"
    if record.mutated_later:
        return "updated in place later in the graph"
    if not _has_python_symbols(node) and all(
        (decided.get(arg) is Action.FOLD) if facts[arg].tensor_outputs else _constant_scalar(arg)
        for arg in node.all_input_nodes
    ):
        return Action.FOLD
    exact = all(ops.is_exact(op, record.integral_outputs) for op in record.ops)
    if not exact:
        inexact = sorted(
            {ops.op_name(op) for op in record.ops if not ops.is_exact(op, record.integral_outputs)}
        )
        return f"CPU arithmetic that the GPU would round differently ({', '.join(inexact)})"
    tensor_inputs = [arg for arg in node.all_input_nodes if facts[arg].tensor_outputs]
    if not tensor_inputs:
        if node.op == "call_function" and ops.callable_name(node.target) in ops.FACTORY_CALLABLES:
            return Action.FACTORY
        return "creates a CPU tensor from symbolic values through a call without a device argument"
    return Action.FOLLOW


def _holds_symbols(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds_symbols(v) for v in value)
    return compat.is_symbolic(value)


def _constant_scalar(node: torch.fx.Node) -> bool:
    """A non-tensor node whose value is fixed for this trace (Dynamo guards on it)."""
    return node.op not in ("placeholder", "get_attr") and not _holds_symbols(compat.node_value(node))


def _has_python_symbols(node: torch.fx.Node) -> bool:
    """Symbols written into the node's arguments directly (not through other nodes)."""
    direct = [v for v in (*node.args, *node.kwargs.values()) if not isinstance(v, torch.fx.Node)]
    return _holds_symbols(direct)


def plan(
    gm: torch.fx.GraphModule,
    facts: GraphFacts,
    target: torch.device,
    example_inputs: Sequence[Any] | None = None,
) -> Plan:
    """Choose the CPU nodes that move to ``target`` (see the module docstring)."""
    result = Plan(target=target)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = list(example_inputs) if example_inputs is not None else []
    candidates: dict[torch.fx.Node, Action] = {}
    for node in gm.graph.nodes:
        record = facts[node]
        if node.op == "output" or not record.on_cpu:
            continue
        if node.op == "placeholder":
            example = _example_for(node, placeholders, inputs)
        elif node.op == "get_attr":
            example = _attribute_tensor(gm, node)
        else:
            example = None
        action = _initial_action(gm, node, facts, example, candidates)
        if isinstance(action, Action):
            candidates[node] = action
        else:
            result.blocked[node] = action

    changed = True
    while changed:
        changed = False
        for node in list(candidates):
            reason = _violation(node, candidates, facts, target)
            if reason:
                del candidates[node]
                result.blocked[node] = reason
                changed = True

    result.actions = candidates
    for node in candidates:
        for user in node.users:
            if user not in candidates and _is_copy_to(facts[user], target):
                result.border_copies[user] = _must_stay_copy(user, node, candidates, facts)
    return result


def _violation(
    node: torch.fx.Node,
    candidates: dict[torch.fx.Node, Action],
    facts: GraphFacts,
    target: torch.device,
) -> str:
    """Why ``node`` cannot move given the current candidates ('' if it can)."""
    for arg in node.all_input_nodes:
        arg_facts = facts[arg]
        if arg_facts.on_cpu and arg_facts.tensor_outputs and arg not in candidates:
            return "one of its CPU inputs stays on the CPU"
        if candidates.get(node) is Action.FOLD and candidates.get(arg) not in (None, Action.FOLD):
            return "depends on a value that is not constant"
    for user in node.users:
        if user.op == "output":
            return "the graph returns this CPU tensor"
        if user in candidates:
            continue
        user_facts = facts[user]
        if _is_copy_to(user_facts, target):
            continue
        if user_facts.devices == frozenset({target}):
            continue
        if _is_metadata_only(user_facts):
            continue
        if any(ops.is_sync(op) for op in user_facts.ops) or (
            user.op == "call_method" and user.target in ops.SYNC_METHODS
        ):
            return f"{user.name} reads its value on the host"
        return f"used on the CPU by {user.name}"
    return ""


def _must_stay_copy(
    copy_node: torch.fx.Node,
    source: torch.fx.Node,
    candidates: dict[torch.fx.Node, Action],
    facts: GraphFacts,
) -> bool:
    """Note [Aliasing at the border]."""
    shared = candidates.get(source) in (Action.ATTRIBUTE, Action.FOLD)
    if not shared:
        return False
    record = facts[copy_node]
    return record.mutated_later or bool(record.storages & facts.output_storages)
