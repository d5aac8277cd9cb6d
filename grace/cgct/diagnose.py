"""List every reason Inductor would refuse or split CUDA graphs for an FX graph, node by node.

Problem: Inductor decides late (while lowering, or at the first call) and says why in one log line,
differently per release: before 2.9 a CPU node disables CUDA graphs for the whole Dynamo graph, from
2.9 graph partitions split the graph around it. Users and the matrix need each reason with its node
and source line, on any machine, before compiling.

Design: run the graph on fake tensors (grace.cgct.analysis), assume the graph's CUDA device is the
target, and walk the facts with the same tests Inductor applies: devices of every node, mutated
inputs, forbidden or unsafe ops, data-dependent ops, unbacked symbols, control flow, input types,
symbolic shapes, memory overlap of inputs, the caching allocator switch. The effect of each reason on
this torch and configuration (disables, splits, re-records) comes from grace.compat.dynamo. CPU nodes
are reported through the relocation plan (grace.cgct.plan), so a diagnosis says why a CPU node has
to stay where it is, or how CGCT moved it.

Invariant: diagnosis never changes the graph or the caller's tensors.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from grace.cgct import ops
from grace.cgct.analysis import GraphFacts, analyze
from grace.cgct.plan import Action, Plan, plan
from grace.cgct.reasons import Diagnosis, Effect, ReasonCode, node_label, source_of
from grace.compat import dynamo as compat

log = logging.getLogger(__name__)

_CONTROL_FLOW = ("cond", "while_loop", "scan", "map_impl", "associative_scan")


def diagnose(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None) -> list[Diagnosis]:
    """Every reason the graph cannot be captured whole, assuming its CUDA device is the target."""
    facts = analyze(gm, example_inputs)
    return collect(gm, example_inputs, facts)


def target_device(facts: GraphFacts) -> torch.device | None:
    devices = facts.cuda_devices()
    return next(iter(devices)) if len(devices) == 1 else None


def _split_or_disable() -> Effect:
    return Effect.SPLITS_GRAPH if compat.graph_partition_enabled() else Effect.DISABLES_GRAPHS


def _cpu_code() -> ReasonCode:
    return ReasonCode.PARTITION_SPLIT_CPU_OP if compat.graph_partition_enabled() else ReasonCode.CPU_DEVICE


def _diagnosis(
    code: ReasonCode, node: torch.fx.Node, message: str, effect: Effect, transformed: bool = False
) -> Diagnosis:
    return Diagnosis(
        code=code,
        node=node_label(node),
        source=source_of(node),
        message=message,
        transformed=transformed,
        effect=Effect.NONE if transformed else effect,
    )


def collect(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any] | None,
    facts: GraphFacts,
    relocation: Plan | None = None,
    fixed: Mapping[torch.fx.Node, str] | None = None,
) -> list[Diagnosis]:
    """Diagnoses from analysed facts; ``fixed`` maps nodes CGCT moved to how it moved them."""
    found: list[Diagnosis] = []
    fixed = fixed or {}
    if compat.caching_allocator_disabled():
        first = next(iter(gm.graph.nodes))
        found.append(
            _diagnosis(
                ReasonCode.CACHING_ALLOCATOR_DISABLED,
                first,
                "PYTORCH_NO_CUDA_MEMORY_CACHING is set; unset it to allow CUDA graphs",
                Effect.DISABLES_GRAPHS,
            )
        )
    cuda = facts.cuda_devices()
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    if not cuda:
        found.append(_diagnosis(ReasonCode.NO_CUDA_WORK, output, "no CUDA tensor in the graph", Effect.NONE))
        return found
    if len(cuda) > 1:
        names = ", ".join(sorted(str(d) for d in cuda))
        found.append(
            _diagnosis(ReasonCode.MULTIPLE_DEVICES, output, f"tensors on {names}", Effect.DISABLES_GRAPHS)
        )
    found.extend(_cpu_diagnoses(gm, example_inputs, facts, relocation, fixed))
    found.extend(_op_diagnoses(gm, facts))
    found.extend(_input_diagnoses(gm, example_inputs, facts))
    return found


def _cpu_diagnoses(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any] | None,
    facts: GraphFacts,
    relocation: Plan | None,
    fixed: Mapping[torch.fx.Node, str],
) -> list[Diagnosis]:
    target = target_device(facts)
    if target is None:
        return []
    if relocation is None:
        relocation = plan(gm, facts, target, example_inputs)
    found: list[Diagnosis] = []
    for node, message in fixed.items():
        code = ReasonCode.CPU_ATTRIBUTE if relocation.actions.get(node) is Action.ATTRIBUTE else _cpu_code()
        found.append(_diagnosis(code, node, message, _split_or_disable(), transformed=True))
    for node, reason in relocation.blocked.items():
        if node in fixed or _blocked_by_input(node, relocation):
            continue
        is_attribute = node.op == "get_attr" or (
            node.op == "placeholder" and compat.is_attribute_source(compat.placeholder_source_name(node))
        )
        code = ReasonCode.CPU_ATTRIBUTE if is_attribute else _cpu_code()
        if any(d.type == "cuda" for d in facts[node].input_devices) and facts[node].on_cpu:
            code = ReasonCode.DEVICE_COPY
        found.append(_diagnosis(code, node, f"stays on the CPU: {reason}", _split_or_disable()))
    if not fixed:
        for node, action in relocation.actions.items():
            if action is not Action.FOLLOW and not _folded_interior(node, relocation):
                found.append(
                    _diagnosis(
                        ReasonCode.CPU_ATTRIBUTE if action is Action.ATTRIBUTE else _cpu_code(),
                        node,
                        f"CPU work that CGCT can move to {target} ({action.value})",
                        _split_or_disable(),
                    )
                )
    return found


def _blocked_by_input(node: torch.fx.Node, relocation: Plan) -> bool:
    """A blocked node whose reason is a blocked CPU input: report the input, not every follower."""
    return relocation.blocked.get(node) == "one of its CPU inputs stays on the CPU" and any(
        arg in relocation.blocked for arg in node.all_input_nodes
    )


def _folded_interior(node: torch.fx.Node, relocation: Plan) -> bool:
    return relocation.actions.get(node) is Action.FOLD and all(
        relocation.actions.get(user) is Action.FOLD for user in node.users
    )


def _op_diagnoses(gm: torch.fx.GraphModule, facts: GraphFacts) -> list[Diagnosis]:
    found: list[Diagnosis] = []
    effect = _split_or_disable()
    for node in gm.graph.nodes:
        record = facts[node]
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        if not record.ran and record.error and not record.error.startswith("not run"):
            found.append(
                _diagnosis(
                    ReasonCode.ANALYSIS_INCOMPLETE,
                    node,
                    f"could not run on fake tensors ({record.error}); used recorded metadata",
                    Effect.NONE,
                )
            )
        syncs = sorted({ops.op_name(op) for op in record.ops if ops.is_sync(op)})
        unbacked = compat.has_unbacked_symbols(compat.node_value(node)) or compat.has_unbacked_symbols(
            record.value
        )
        if syncs or (node.op == "call_method" and node.target in ops.SYNC_METHODS) or unbacked:
            what = ", ".join(syncs) if syncs else "a data-dependent value"
            found.append(
                _diagnosis(
                    ReasonCode.DATA_DEPENDENT_SYNC,
                    node,
                    f"reads {what} on the host; needs a real synchronisation, left alone",
                    effect,
                )
            )
            continue
        forbidden = sorted({str(op) for op in record.ops if ops.is_forbidden_in_graphs(op)})
        sparse = any(t.is_sparse for t in record.tensor_outputs)
        bool_index_put = _bool_index_put(record)
        if forbidden or sparse or bool_index_put:
            what = ", ".join(forbidden) or ("sparse output" if sparse else "index_put with boolean indices")
            found.append(_diagnosis(ReasonCode.INCOMPATIBLE_OP, node, f"{what} cannot be captured", effect))
        name = ops.callable_name(node.target)
        if any(part == name for part in _CONTROL_FLOW) or "higher_order.cond" in str(node.target):
            control_effect = (
                Effect.DISABLES_GRAPHS if name == "cond" or not compat.graph_partition_enabled() else effect
            )
            found.append(
                _diagnosis(ReasonCode.CONTROL_FLOW, node, f"control-flow operator {name}", control_effect)
            )
    return found


def _bool_index_put(record: Any) -> bool:
    index_puts = ("aten.index_put", "aten.index_put_", "aten._unsafe_index_put")
    return any(ops.op_name(op) in index_puts for op in record.ops) and _has_bool_indices(record)


def _has_bool_indices(record: Any) -> bool:
    node = record.node
    for arg in node.all_input_nodes:
        value = compat.node_value(arg)
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if isinstance(item, torch.Tensor) and item.dtype in (torch.bool, torch.uint8):
                return True
    return False


def _input_diagnoses(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None, facts: GraphFacts
) -> list[Diagnosis]:
    found: list[Diagnosis] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = (
        list(example_inputs) if example_inputs is not None else [compat.node_value(n) for n in placeholders]
    )
    for node in facts.mutated_placeholders:
        if compat.is_attribute_source(compat.placeholder_source_name(node)):
            continue  # parameters and buffers are static inputs: their mutation is allowed
        supported = compat.input_mutation_supported()
        note = " (accepted only when the input is the output of an earlier CUDA graph)" if supported else ""
        found.append(
            _diagnosis(
                ReasonCode.MUTATED_INPUTS,
                node,
                f"the graph writes to this input in place{note}",
                Effect.DISABLES_GRAPHS,
            )
        )
    allowed = compat.allowed_input_types()
    dynamic_effect = _split_or_disable() if compat.skip_dynamic_graphs() else Effect.RERECORDS
    overlap_checked = compat.checks_complex_memory_overlap()
    for node, value in zip(placeholders, inputs, strict=False):
        if value is not None and not isinstance(value, allowed):
            found.append(
                _diagnosis(
                    ReasonCode.NON_TENSOR_INPUTS,
                    node,
                    f"input of type {type(value).__name__}",
                    Effect.DISABLES_GRAPHS,
                )
            )
        meta = compat.node_value(node)
        if compat.is_symbolic(meta) or compat.is_symbolic(value):
            found.append(
                _diagnosis(
                    ReasonCode.DYNAMIC_SHAPES,
                    node,
                    "symbolic shape: one CUDA graph is recorded per distinct shape",
                    dynamic_effect,
                )
            )
        if overlap_checked and isinstance(value, torch.Tensor) and has_complex_overlap(value):
            found.append(
                _diagnosis(
                    ReasonCode.COMPLEX_MEMORY_OVERLAP,
                    node,
                    "input elements overlap in memory; pass a contiguous copy",
                    Effect.DISABLES_GRAPHS,
                )
            )
    return found


def has_complex_overlap(tensor: torch.Tensor) -> bool:
    """Elements alias each other in memory, beyond broadcast (stride 0) and size-1 dimensions."""
    dims = [
        (compat.concrete_int(stride), compat.concrete_int(size))
        for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
        if compat.concrete_int(size) != 1 and compat.concrete_int(stride) != 0
    ]
    dims.sort()
    span = 1
    for stride, size in dims:
        if stride < span:
            return True
        span = stride * size
    return False
