"""What a Dynamo FX graph and its example inputs say about capturing it in a CUDA graph.

Problem: before compiling, the backend must know which inputs are static (parameters and buffers, used
in place by the graph), which are dynamic (copied or indirected on each call), which are plain numbers
(baked into a graph, so part of its signature), which inputs the graph mutates, and whether anything
forbids a graph: CPU tensors, several devices, autograd, collectives when several ranks run the graph.

Design: pure functions over the FX graph and the example inputs (no CUDA work, testable on CPU with
meta information from Dynamo's ``example_value``). Mutations and random ops (``graph_effects``) come
from the op schemas: the graph runs once on fake tensors and every dispatched op's written arguments
are mapped back to the inputs' storages (``grace.compat.dispatch``), so ``_foreach_`` ops, custom ops
with ``Tensor(a!)``, ``out=`` and writes through views are all seen, with no version counter needed
(inference tensors have none). The name-based scan (``mutated_inputs``, ``random_ops``) is kept as a
floor: the result is the union of both. The runner adds mutations seen at run time through version
counters.

Invariant: when in doubt, report a reason to skip graphs rather than capture something that could
replay stale data (a CPU tensor read at capture time is stale on every replay), and never report "no
mutation" for a graph whose writes could not be attributed (``SkipCode.MUTATION_UNKNOWN``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grace.compat import dispatch as dispatch_compat
from grace.compat import dynamo as dynamo_compat
from grace.compat import torch as torch_compat
from grace.philox import seed_inputs, without_seeds
from grace.reasons import SkipCode, SkipReason

_VIEW_NAMES = frozenset(
    {
        "view", "view_as", "reshape", "reshape_as", "__getitem__", "getitem", "transpose",
        "permute", "narrow", "select", "unsqueeze", "squeeze", "expand", "expand_as", "as_strided", "t",
        "flatten", "unflatten", "split", "split_with_sizes", "chunk", "unbind", "diagonal", "movedim",
        "moveaxis", "swapaxes", "swapdims", "real", "imag", "view_as_real", "view_as_complex", "detach",
        "contiguous", "unfold", "alias", "tensor_split", "hsplit", "vsplit", "T", "mT", "H", "mH",
    }
)  # fmt: skip
_INPLACE_OPERATORS = frozenset(
    {
        operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
        operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
        operator.ilshift, operator.irshift, operator.imatmul,
    }
)  # fmt: skip


@dataclass(frozen=True)
class InputAnalysis:
    static_indices: tuple[int, ...]
    dynamic_indices: tuple[int, ...]
    scalar_indices: tuple[int, ...]
    device: torch.device | None
    skip: SkipReason | None


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    name = getattr(target, "__name__", None) or str(target)
    return name.split(".")[-1]


def analyze_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> InputAnalysis:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names = [n.name for n in placeholders]
    static: list[int] = []
    dynamic: list[int] = []
    scalars: list[int] = []
    devices: set[torch.device] = set()
    skip: SkipReason | None = None
    seeds = set(seed_inputs(gm))  # Note: [Philox seeds of attention] in grace.philox

    def first(reason: SkipReason) -> None:
        nonlocal skip
        if skip is None:
            skip = reason

    for i, value in enumerate(example_inputs):
        name = names[i] if i < len(names) else f"input {i}"
        if isinstance(value, torch.Tensor):
            placeholder = placeholders[i] if i < len(placeholders) else None
            (static if torch_compat.is_static_input(placeholder, value) else dynamic).append(i)
            if value.device.type == "cuda":
                devices.add(value.device)
            elif i not in seeds:
                first(SkipReason(SkipCode.CPU_INPUT, f"input {name} is on {value.device}"))
        elif isinstance(value, (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool)):
            scalars.append(i)
        else:
            first(SkipReason(SkipCode.UNSUPPORTED_INPUT, f"input {name} is a {type(value).__name__}"))

    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        value = without_seeds(node, torch_compat.node_example_value(node))
        for tensor in _tensors_in(value):
            if tensor.device.type == "cuda":
                devices.add(tensor.device)
            elif tensor.device.type == "cpu":
                first(SkipReason(SkipCode.CPU_OP, f"cpu device ({node.name}: {_target_name(node)})"))

    collectives = collective_skip(gm, dynamo_compat.distributed_world_size())
    if collectives is not None:
        first(collectives)

    device: torch.device | None = None
    if len(devices) > 1:
        first(SkipReason(SkipCode.MULTIPLE_DEVICES, f"devices {sorted(str(d) for d in devices)}"))
    elif devices:
        device = next(iter(devices))
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    else:
        first(SkipReason(SkipCode.NO_CUDA_TENSORS, "the graph has no CUDA tensors"))

    if torch.is_grad_enabled():
        grad_inputs = any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
        grad_params = any(p.requires_grad for p in gm.parameters())
        if grad_inputs or grad_params:
            first(
                SkipReason(
                    SkipCode.AUTOGRAD,
                    "inputs require grad with grad mode on: training graphs run without CUDA graphs "
                    "(call under torch.no_grad() or torch.inference_mode() for inference)",
                )
            )
    return InputAnalysis(tuple(static), tuple(dynamic), tuple(scalars), device, skip)


def collective_skip(gm: torch.fx.GraphModule, world_size: int) -> SkipReason | None:
    """Why a graph with collectives runs without CUDA graphs when several ranks run it, or None.

    Every extra run of a graph (grace's deciding call, a numeric check, SCG's timing, a re-capture after
    inputs moved) issues its collectives once more on that rank only; ranks that decide differently then
    wait for each other forever. Until ranks agree on those decisions, such graphs take the no-graph
    path. At world size 1 a collective has no partner to wait for, and the graph is judged as any other.
    """
    if world_size <= 1:
        return None
    names = sorted({n for node in gm.graph.nodes if (n := dynamo_compat.collective_name(node.target))})
    if not names:
        return None
    return SkipReason(
        SkipCode.COLLECTIVES,
        f"collectives ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) across {world_size} ranks: "
        "grace's extra runs could differ between ranks and leave collectives unmatched; "
        "running Inductor without CUDA graphs",
    )


def _tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    return []


@dataclass(frozen=True)
class GraphEffects:
    """The inputs a graph writes and the random ops it runs; ``skip`` when its writes are not known."""

    mutated: tuple[int, ...]
    random_ops: tuple[str, ...]
    skip: SkipReason | None = None


def graph_effects(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> GraphEffects:
    """Which inputs ``gm`` writes and which of its ops draw random numbers, from the op schemas seen
    on a run on fake tensors, joined with the name-based scans; a skip reason when a write cannot be
    attributed or the run fails (then every input counts as possibly written)."""
    by_name = mutated_inputs(gm)
    names = random_ops(gm)
    try:
        seen = dispatch_compat.trace_effects(gm, example_inputs)
    except Exception as exc:
        every = tuple(i for i, v in enumerate(example_inputs) if isinstance(v, torch.Tensor))
        reason = SkipReason(
            SkipCode.MUTATION_UNKNOWN,
            f"running the graph on fake tensors to find the inputs it writes raised {type(exc).__name__}: "
            f"{str(exc)[:200]}",
        )
        return GraphEffects(every, names or ("unknown",), reason)
    mutated = tuple(sorted(set(by_name) | set(seen.written)))
    randoms = tuple(dict.fromkeys((*names, *seen.random_ops)))
    skip = None
    if seen.unattributed:
        skip = SkipReason(
            SkipCode.MUTATION_UNKNOWN,
            f"{', '.join(seen.unattributed[:3])} writes memory that is no input of the graph "
            "(a constant or global tensor): a replay or an extra run would write it again",
        )
    return GraphEffects(mutated, randoms, skip)


def mutated_inputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Indices of placeholders that an op of ``gm`` may write to (directly or through a view), by the
    ops' names: a floor under ``graph_effects``, which reads the op schemas."""
    aliases: dict[torch.fx.Node, frozenset[int]] = {}
    mutated: set[int] = set()
    index = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            aliases[node] = frozenset({index})
            index += 1
            continue
        if node.op not in ("call_function", "call_method"):
            continue
        name = _target_name(node)
        first_arg = node.args[0] if node.args else None
        source = aliases.get(first_arg, frozenset()) if isinstance(first_arg, torch.fx.Node) else frozenset()
        if (name in _VIEW_NAMES or node.target is operator.getitem) and source:
            aliases[node] = source
        written: set[torch.fx.Node] = set()
        is_inplace_name = name.endswith("_") and not name.startswith("_") and name not in _VIEW_NAMES
        if is_inplace_name or node.target in _INPLACE_OPERATORS or node.kwargs.get("inplace") is True:
            if isinstance(first_arg, torch.fx.Node):
                written.add(first_arg)
            if source and node.target in _INPLACE_OPERATORS:
                aliases[node] = source  # ``x += 1`` returns x
        out = node.kwargs.get("out")
        for target in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(target, torch.fx.Node):
                written.add(target)
        for target in written:
            mutated.update(aliases.get(target, frozenset()))
    return tuple(sorted(mutated))


# Substrings of the operators that draw random numbers (aten, prims and Inductor's seed helpers).
_RANDOM_OP_MARKERS = (
    "rand", "bernoulli", "dropout", "normal", "uniform", "exponential", "geometric", "cauchy",
    "multinomial", "poisson", "seed", "philox", "rng",
)  # fmt: skip


def random_ops(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    """The operators of ``gm`` that draw random numbers (a conservative match on their names); a
    dropout whose ``training``/``train`` argument is the constant False draws none.

    A CUDA graph that draws random numbers relies on torch's replay to advance the generator's offset;
    grace.rebind launches graphs itself and declines such graphs."""
    found: list[str] = []
    graphs = [m.graph for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]  # bodies of HOPs too
    for node in (n for graph in graphs for n in graph.nodes):
        if node.op != "call_function":
            continue
        name = str(node.target).lower()
        if not any(marker in name for marker in _RANDOM_OP_MARKERS):
            continue
        if "dropout" in name and _dropout_training(node) is False:
            continue
        if name not in found:
            found.append(name)
    return tuple(found)


def _dropout_training(node: torch.fx.Node) -> Any:
    """The ``training`` (``train``) argument of a dropout call: (input, p, training) in every spelling."""
    for key in ("training", "train"):
        if key in node.kwargs:
            return node.kwargs[key]
    return node.args[2] if len(node.args) > 2 else True
