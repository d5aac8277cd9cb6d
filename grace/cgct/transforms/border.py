"""The border of moved work: copies that became no-ops, and device metadata.

Problem: once CPU work moved to the GPU, the ``.to(device)`` that used to copy its result is a
same-device ``to``: a no-op returning its input. Left in place it is harmless, but it aliases the
input, which matters when the input is shared across calls (a mirrored attribute, a folded constant)
and the copy's result is mutated or returned. And every moved node still carries CPU fake values in
its metadata, which Inductor's passes read.

Design: a border copy that only changed the device becomes its input (or a clone of it, Note
[Aliasing at the border] in grace.cgct.plan); one that also converted dtype or layout stays, now as a
same-device conversion. Fake values of moved nodes are rebuilt on the target device in the same fake
mode, with the same shapes, strides and dtypes.

Invariant: after this pass no node of the plan carries a CPU fake value.
"""

from __future__ import annotations

import torch
import torch.fx

from grace.cgct.analysis import GraphFacts
from grace.cgct.plan import Action, Plan
from grace.cgct.transforms import nodes_by_name
from grace.compat import dynamo as compat
from grace.compat.dynamo import tree_map


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and a.stride() == b.stride()


def settle_border(gm: torch.fx.GraphModule, relocation: Plan, facts: GraphFacts) -> int:
    """Drop or rewrite border copies; returns how many copies left the graph."""
    nodes = nodes_by_name(gm)
    removed = 0
    for planned, must_copy in relocation.border_copies.items():
        node = nodes.get(planned.name)
        if node is None or not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        source = node.args[0]
        planned_source = planned.args[0]
        if not isinstance(planned_source, torch.fx.Node):
            continue
        before = facts[planned_source].tensor_outputs
        after = facts[planned].tensor_outputs
        if len(before) != 1 or len(after) != 1 or not _same_layout(before[0], after[0]):
            continue  # also converts dtype or layout: stays, as a same-device conversion
        if must_copy:
            clone_target = torch.ops.aten.clone.default if compat.is_op_overload(node.target) else torch.clone
            with gm.graph.inserting_before(node):
                clone = gm.graph.call_function(clone_target, (source,))
            clone.meta = dict(node.meta)
            node.replace_all_uses_with(clone)
        else:
            node.replace_all_uses_with(source)
        gm.graph.erase_node(node)
        removed += 1
    return removed


def retarget_metadata(gm: torch.fx.GraphModule, relocation: Plan) -> None:
    """Put the fake values of every moved node on the target device."""
    nodes = nodes_by_name(gm)
    target = relocation.target

    def move(value: object) -> object:
        if isinstance(value, torch.Tensor) and compat.is_fake(value) and value.device.type == "cpu":
            return compat.fake_on_device(value, target)
        return value

    for planned, action in relocation.actions.items():
        if action is Action.FOLD:
            continue  # folded nodes are gone; their get_attr replacements got GPU values
        node = nodes.get(planned.name)
        if node is None:
            continue
        value = compat.node_value(node)
        if value is not None:
            compat.set_node_value(node, tree_map(move, value))
