"""Run a graph on fake tensors and record, per node, its devices, the ATen ops it dispatched and
whether its result was mutated later.

Problem: diagnosis and transforms need facts that FX metadata does not hold: a Dynamo node such as
``x.item()`` or ``x[mask]`` says nothing about the ATen ops (``_local_scalar_dense``, ``nonzero``)
that make Inductor refuse the graph; in-place updates of inputs are visible only by running the
graph. The graph must be analysed on machines without a GPU (CPU cells of the matrix) as if it ran
on CUDA.

Design: a private ``FakeTensorMode`` (with a shape env, so data-dependent ops give unbacked symbols
rather than errors) and, above it, a dispatch mode that records every ATen op. Inputs are rebuilt as
fresh fake tensors with the example inputs' shapes (size hints for symbolic ones), strides, dtypes and
devices, so ``device="cuda"`` works on a CPU-only torch. A node that cannot run on fake tensors
(custom ops without fake kernels, CUDA-only paths on a CPU build) falls back to the value its tracer
recorded, and the fact is kept (``NodeFacts.ran`` is False).

Invariants: the analysis never runs real kernels, never touches the caller's tensors, and restores
grad mode; nodes that flip global state (grad mode, autocast) are not executed. Mutation is read from
version counters, which views share with their base, so writes through views count.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from grace.compat import dynamo as compat
from grace.compat.dynamo import TorchDispatchMode, tree_flatten, tree_map

log = logging.getLogger(__name__)


@dataclass
class NodeFacts:
    """What one node did when run on fake tensors."""

    node: torch.fx.Node
    value: Any = None
    devices: frozenset[torch.device] = frozenset()
    input_devices: frozenset[torch.device] = frozenset()
    aten_ops: tuple[Any, ...] = ()
    ran: bool = False
    error: str = ""
    mutated_later: bool = False
    tensor_outputs: tuple[torch.Tensor, ...] = ()
    storages: frozenset[int] = frozenset()

    @property
    def on_cpu(self) -> bool:
        return any(d.type == "cpu" for d in self.devices)

    @property
    def on_cuda(self) -> bool:
        return any(d.type == "cuda" for d in self.devices)

    @property
    def ops(self) -> tuple[Any, ...]:
        """The ATen ops that compute something (``prim.*`` metadata queries left out)."""
        return tuple(op for op in self.aten_ops if not str(op).startswith("prim."))

    @property
    def integral_outputs(self) -> bool:
        return all(not (t.dtype.is_floating_point or t.dtype.is_complex) for t in self.tensor_outputs)


@dataclass
class GraphFacts:
    """Facts for every node of one graph, in graph order."""

    nodes: dict[torch.fx.Node, NodeFacts] = field(default_factory=dict)
    mutated_placeholders: tuple[torch.fx.Node, ...] = ()
    output_storages: frozenset[int] = frozenset()

    def __getitem__(self, node: torch.fx.Node) -> NodeFacts:
        return self.nodes[node]

    def cuda_devices(self) -> set[torch.device]:
        found: set[torch.device] = set()
        for facts in self.nodes.values():
            found.update(d for d in facts.devices if d.type == "cuda")
        return found

    def output_signature(self) -> list[tuple[str, tuple[int, ...], torch.dtype] | None]:
        """Device, shape and dtype of every graph output, for before/after comparisons."""
        output = next(n for n in reversed(self.nodes) if n.op == "output")
        flat, _ = tree_flatten(self.nodes[output].value)
        signature: list[tuple[str, tuple[int, ...], torch.dtype] | None] = []
        for value in flat:
            if isinstance(value, torch.Tensor):
                shape = tuple(compat.concrete_int(s) for s in value.shape)
                signature.append((str(value.device), shape, value.dtype))
            else:
                signature.append(None)
        return signature


class _Recorder(TorchDispatchMode):
    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _flat_tensors(value: Any) -> tuple[torch.Tensor, ...]:
    flat, _ = tree_flatten(value)
    return tuple(v for v in flat if isinstance(v, torch.Tensor))


def _fake_like(mode: Any, value: Any) -> Any:
    """A fresh fake in ``mode`` shaped like ``value`` (a real or fake tensor, or a symbol)."""
    if isinstance(value, torch.Tensor):
        shape = [compat.concrete_int(s) for s in value.shape]
        stride = [compat.concrete_int(s) for s in value.stride()]
        with mode:
            return torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        hint = getattr(value.node, "hint", None)
        if hint is not None:
            return hint
        return compat.concrete_int(value)
    return value


@contextlib.contextmanager
def _preserved_global_state() -> Iterator[None]:
    grad = torch.is_grad_enabled()
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_grad_enabled(grad)


def analyze(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None) -> GraphFacts:
    """Run ``gm`` on fresh fake tensors and return the facts of every node."""
    mode = compat.new_fake_mode()
    facts = GraphFacts()
    env: dict[torch.fx.Node, Any] = {}
    versions: dict[int, tuple[torch.Tensor, int]] = {}
    placeholder_index = 0
    placeholders: list[tuple[torch.fx.Node, tuple[torch.Tensor, ...]]] = []
    inputs = list(example_inputs) if example_inputs is not None else None

    with _preserved_global_state():
        for node in gm.graph.nodes:
            record = NodeFacts(node=node)
            facts.nodes[node] = record
            if node.op == "placeholder":
                source = compat.node_value(node)
                if inputs is not None and placeholder_index < len(inputs):
                    source = inputs[placeholder_index]
                placeholder_index += 1
                value = _fake_like(mode, source)
                record.ran = True
                placeholders.append((node, _flat_tensors(value)))
            elif node.op == "get_attr":
                value = _fake_like(mode, _get_attr(gm, str(node.target)))
                record.ran = True
            elif node.op == "output":
                value = torch.fx.node.map_arg(node.args[0], lambda n: env[n])
                record.ran = True
            else:
                value = _run_node(gm, node, env, mode, record)
            env[node] = value
            record.value = value
            record.tensor_outputs = _flat_tensors(value)
            record.devices = frozenset(t.device for t in record.tensor_outputs)
            record.storages = frozenset(_storage_ids(record.tensor_outputs))
            record.input_devices = frozenset(
                t.device for arg in node.all_input_nodes for t in _flat_tensors(env.get(arg))
            )
            for tensor in record.tensor_outputs:
                versions.setdefault(id(tensor), (tensor, tensor._version))

    for record in facts.nodes.values():
        record.mutated_later = any(
            t._version != versions[id(t)][1] for t in record.tensor_outputs if id(t) in versions
        )
    output = next(n for n in reversed(facts.nodes) if n.op == "output")
    facts.output_storages = facts.nodes[output].storages
    facts.mutated_placeholders = tuple(
        node for node, tensors in placeholders if any(t._version != 0 for t in tensors)
    )
    return facts


def _storage_ids(tensors: Sequence[torch.Tensor]) -> Iterator[int]:
    for tensor in tensors:
        with contextlib.suppress(Exception):
            yield tensor.untyped_storage()._cdata


def _get_attr(gm: torch.fx.GraphModule, target: str) -> Any:
    owner: Any = gm
    for part in target.split("."):
        owner = getattr(owner, part)
    return owner


def _run_node(
    gm: torch.fx.GraphModule,
    node: torch.fx.Node,
    env: dict[torch.fx.Node, Any],
    mode: Any,
    record: NodeFacts,
) -> Any:
    args = torch.fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
    if node.op == "call_function" and compat.global_state_callable(node.target):
        record.error = "not run: changes global state"
        return compat.node_value(node)
    recorder = _Recorder()
    try:
        with mode, recorder:
            if node.op == "call_function":
                value = node.target(*args, **kwargs)  # type: ignore[operator]
            elif node.op == "call_method":
                value = getattr(args[0], str(node.target))(*args[1:], **kwargs)
            else:
                value = gm.get_submodule(str(node.target))(*args, **kwargs)
        record.ran = True
    except Exception as error:  # the recorded metadata stands in for a node we cannot run
        record.error = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        log.debug("fake run of %s failed: %s", node.name, record.error)
        value = tree_map(lambda v: _fake_like(mode, v), compat.node_value(node))
    record.aten_ops = tuple(recorder.ops)
    return value
