"""CPU module attributes (parameters, buffers, plain tensors, lists of tensors) put on the GPU.

Problem: a detection model's anchors buffer, a lookup table or a frozen parameter left on the CPU is
read by every call and copied to the GPU inside the graph, which then cannot be captured whole.

Design, two ways, chosen per attribute:
- Move (the paper's way): relocate the tensor object itself to the GPU (``Tensor.data``), so every
  holder (the module, a list, a closure) sees a GPU tensor from now on, and ask Dynamo to trace the
  frame again; the new graph reads a GPU attribute and contains no copy. Possible where a backend can
  ask for a retrace (Note [Asking Dynamo to retrace] in grace.compat.dynamo) and the tensor is a
  plain leaf (not a view, no autograd history, not trainable).
- Mirror: keep the attribute where it is and give the graph a GPU copy (an input the adapter swaps
  in, or a non-persistent buffer of the graph module), refreshed in place when the attribute's
  version counter or identity changes. Used where a retrace is not possible, where the user asked
  for no moves, and for an attribute that is on the CPU again after CGCT moved it (never moved
  twice: no retrace loop).

Invariants: a moved tensor keeps its class, dtype, values and ``requires_grad``; the only visible
change is its device. The process-wide registry of moved sources guarantees at most one retrace per
attribute source. The plan never hands over attributes the graph mutates or returns.
"""

from __future__ import annotations

import enum
import logging
import weakref
from typing import Any

import torch
import torch.fx

from grace.cgct.adapter import MirrorStep
from grace.cgct.plan import Action, Plan
from grace.cgct.transforms import example_fake_mode, materialize, nodes_by_name
from grace.compat import dynamo as compat

log = logging.getLogger(__name__)


class AttributePolicy(str, enum.Enum):
    MOVE = "move"
    """Move for good and retrace where possible, mirror otherwise (default)."""
    MIRROR = "mirror"
    """Never touch user state: always mirror."""


_moved_sources: dict[str, int] = {}
_moved_tensors: dict[int, weakref.ref[torch.Tensor]] = {}


def reset_moved_registry() -> None:
    """Forget which attributes were moved (tests; a fresh ``torch._dynamo.reset()``)."""
    _moved_sources.clear()
    _moved_tensors.clear()


def moved_sources() -> dict[str, int]:
    return dict(_moved_sources)


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


def _may_move(tensor: torch.Tensor, source: str) -> str:
    """'' if the tensor may be moved for good, else why not."""
    if tensor._base is not None:
        return "it is a view of another tensor"
    if tensor.grad_fn is not None or tensor.requires_grad:
        return "it takes part in autograd"
    seen = _moved_tensors.get(id(tensor))
    if (seen is not None and seen() is tensor) or _moved_sources.get(source, 0) > 0:
        return "CGCT moved it once already and it is on the CPU again"
    return ""


def move_and_retrace(
    gm: torch.fx.GraphModule, relocation: Plan, example_inputs: list[Any], policy: AttributePolicy
) -> None:
    """Move every movable planned attribute to the GPU and raise Dynamo's retrace request.

    Returns normally (moving nothing) when no attribute can be moved or no retrace can be asked for;
    the caller then mirrors them.
    """
    if policy is not AttributePolicy.MOVE:
        return
    planned = relocation.nodes(Action.ATTRIBUTE)
    if not planned or compat.restart_exception_type() is None:
        return
    movable: list[tuple[str, torch.Tensor]] = []
    for node in planned:
        tensor = _attribute_tensor(gm, node, example_inputs)
        source = _source_name(node)
        why_not = _may_move(tensor, source)
        if why_not:
            log.info("CGCT mirrors %s instead of moving it: %s", source, why_not)
            continue
        movable.append((source, tensor))
    if not movable:
        return
    for source, tensor in movable:
        compat.relocate_tensor(tensor, relocation.target)
        _moved_tensors[id(tensor)] = weakref.ref(tensor)
        _moved_sources[source] = _moved_sources.get(source, 0) + 1
    names = ", ".join(source for source, _ in movable)
    log.warning("CGCT moved CPU attributes to %s for good: %s; retracing", relocation.target, names)
    restart = compat.make_restart(f"CGCT moved CPU attributes to {relocation.target}: {names}")
    if restart is not None:
        raise restart


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
            steps.append(MirrorStep(source=tensor, mirror=mirror, index=placeholders.index(node)))
            compat.mark_static_input(node, mirror)
        else:
            name = f"_cgct_mirror_{len(mirrors)}"
            # A buffer, not a plain attribute: AOTAutograd lifts buffers into its fake trace (a plain
            # tensor attribute reaches it as a real tensor and stops Inductor's compile).
            gm.register_buffer(name, mirror, persistent=False)
            mirrors[name] = tensor
            node.target = name
            steps.append(MirrorStep(source=tensor, mirror=mirror, index=None))
        fixed[original[planned.name]] = (
            f"{_source_name(node)} mirrored on {relocation.target}, refreshed when it changes"
        )
    gm._cgct_mirrors = mirrors  # type: ignore[assignment]
    return steps, fixed
