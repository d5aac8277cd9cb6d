"""Philox seeds that live on the host outside a capture and on the device inside one.

Note: [Philox seeds of attention]
Problem: memory-efficient attention with dropout (``_scaled_dot_product_efficient_attention``,
``_efficient_attention_forward``) returns the Philox seed and offset it drew with as tensors whose place
depends on the stream: 0-dimensional int64 CPU tensors in a plain run, CUDA tensors written by a kernel
while a stream captures (a replay must draw new numbers without the host). Its backward reads them by
the same rule: as device pointers while capturing, by dereferencing them on the host otherwise. So in
training the forward graph's replay hands the backward device seeds, and every plain run of that
backward (its warm-up, the deciding call's reference, checks, the fallback entry) would dereference a
device pointer on the host.

Design: the seeds are found by the schema names of the attention ops (``philox_seed``,
``philox_offset``), not by their example values (AOTAutograd's fake seeds sit on the device):
- ``seed_outputs``: a graph's outputs that are such returns; their device may differ between a replay
  and a plain run (``grace.scg.devices_differ`` lets them), and nothing else's may;
- ``seed_inputs``: placeholders passed as such arguments; the analysis does not count them as CPU
  inputs (``without_seeds`` for node values likewise);
- ``host_seeds``: the graph's entry, wrapped so that outside a capture a 0-dimensional device seed
  becomes a host copy before the op reads it. Inside a capture the device seed is passed as it is, so
  the captured backward reads the seeds each forward replay writes. Flash attention keeps its
  ``rng_state`` on the device in both modes (not 0-dimensional) and is passed unchanged; cuDNN
  attention's backward rejects host seeds, so its seed arguments are no seed inputs
  (``grace.compat.generators.reads_seeds_on_device``).

Note: [Random state of an op that draws nothing]
An attention op called with ``dropout_p`` 0 draws no numbers, and the random state it returns is left
uninitialised (memory-efficient attention's ``philox_seed`` and ``philox_offset`` are ``empty`` host
tensors in a plain run and ``empty`` device tensors while capturing): two plain runs, or a plain run and
a replay, return whatever the memory held (BlenderbotSmall's decoder forward, whose attention has no
dropout, was declined for one such int64 differing). Its backward reads that state only to redraw a
dropout mask, so with ``dropout_p`` 0 nothing reads it. ``undefined_outputs`` names such outputs; the
numeric checks leave them out (``grace.scg.outputs_match``'s ``undefined``), as they leave nothing
else out. A ``dropout_p`` that is not a number in the graph (a symbolic value) counts as drawing.

Invariant: a backward that receives host seeds (its forward ran without a graph) gets a slot of its own
that runs without a graph (a dynamic input on another device: grace.runner), so a captured backward
never reads a host pointer, and a plain run never dereferences a device one.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from grace import boxing
from grace.boxing import Inputs, TakesList
from grace.compat import generators
from grace.compat import torch as torch_compat

SEED_NAMES = frozenset({"philox_seed", "philox_offset"})
RANDOM_STATE_NAMES = SEED_NAMES | {"rng_state"}  # flash attention's state is one device tensor


def _schema(node: torch.fx.Node) -> Any:
    return getattr(node.target, "_schema", None) if node.op == "call_function" else None


def _returned_by(node: torch.fx.Node) -> tuple[torch.fx.Node, Any, str] | None:
    """(op node, its schema, the return's name) when ``node`` is ``getitem(op, i)`` of a schema op."""
    if node.op != "call_function" or node.target is not operator.getitem or len(node.args) < 2:
        return None
    source, index = node.args[0], node.args[1]
    schema = _schema(source) if isinstance(source, torch.fx.Node) else None
    if schema is None or not isinstance(index, int) or not 0 <= index < len(schema.returns):
        return None
    assert isinstance(source, torch.fx.Node)
    return source, schema, schema.returns[index].name


def _is_seed_return(node: torch.fx.Node) -> bool:
    """Whether ``node`` is ``getitem(op, i)`` where the op's i-th return is named as a seed."""
    found = _returned_by(node)
    return found is not None and found[2] in SEED_NAMES


def _argument(node: torch.fx.Node, schema: Any, name: str) -> Any:
    """The value ``node`` passes for its schema's argument ``name`` (its default when left out)."""
    for position, argument in enumerate(schema.arguments):
        if argument.name == name:
            if name in node.kwargs:
                return node.kwargs[name]
            if position < len(node.args):
                return node.args[position]
            return argument.default_value if argument.has_default_value() else None
    return None


def _draws_nothing(node: torch.fx.Node) -> bool:
    """Whether ``getitem(op, i)`` is random state of an op called with ``dropout_p`` the number 0."""
    found = _returned_by(node)
    if found is None or found[2] not in RANDOM_STATE_NAMES:
        return False
    dropout = _argument(found[0], found[1], "dropout_p")
    return isinstance(dropout, (int, float)) and not isinstance(dropout, bool) and dropout == 0


def _output_values(gm: torch.fx.GraphModule) -> Sequence[Any]:
    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if output is None or not output.args:
        return ()
    values = output.args[0]
    return values if isinstance(values, (list, tuple)) else (values,)


def seed_outputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Positions in ``gm``'s output tuple that hold an attention op's Philox seed or offset."""
    values = _output_values(gm)
    return tuple(i for i, v in enumerate(values) if isinstance(v, torch.fx.Node) and _is_seed_return(v))


def undefined_outputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Positions in ``gm``'s output tuple that hold random state of an op that draws nothing, whose
    values are undefined (Note: [Random state of an op that draws nothing])."""
    values = _output_values(gm)
    return tuple(i for i, v in enumerate(values) if isinstance(v, torch.fx.Node) and _draws_nothing(v))


def seed_inputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Positions of ``gm``'s placeholders that an op takes as an argument named as a seed."""
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    found: set[int] = set()
    for node in gm.graph.nodes:
        schema = _schema(node)
        if schema is None or generators.reads_seeds_on_device(schema.name):
            continue  # no host copy for an op that reads its seeds on the device in any run
        for position, argument in enumerate(schema.arguments):
            if argument.name not in SEED_NAMES:
                continue
            value = node.kwargs.get(argument.name, node.args[position] if position < len(node.args) else None)
            if isinstance(value, torch.fx.Node) and value in placeholders:
                found.add(placeholders[value])
    return tuple(sorted(found))


def without_seeds(node: torch.fx.Node, value: Any) -> Any:
    """``value`` (a node's example value) with an attention op's seeds left out: their device is the
    stream's mode, not the graph's (module docstring)."""
    schema = _schema(node)
    if _is_seed_return(node):
        return None
    if schema is not None and isinstance(value, (list, tuple)) and len(value) == len(schema.returns):
        return [None if r.name in SEED_NAMES else v for r, v in zip(schema.returns, value, strict=True)]
    return value


def _host_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.device.type != "cpu":
        return value.cpu()
    return value


def host_seeds(compiled: Callable[..., Any], indices: Sequence[int]) -> Callable[..., Any]:
    """``compiled`` (positional inputs, or the call's ``Inputs``: grace.boxing) with the seed inputs at
    ``indices`` as host copies whenever the current stream is not capturing (module docstring);
    ``compiled`` itself when there are none."""
    if not indices:
        return compiled
    return _HostSeeds(compiled, frozenset(indices))


class _HostSeeds(TakesList):
    __slots__ = ("__wrapped__", "compiled", "wanted")

    def __init__(self, compiled: Callable[..., Any], wanted: frozenset[int]) -> None:
        self.compiled, self.wanted = compiled, wanted
        self.__wrapped__ = compiled

    def __call__(self, *args: Any) -> Any:
        if torch_compat.is_current_stream_capturing():
            return self.compiled(*args)
        wanted = self.wanted
        return self.compiled(*(_host_copy(a) if i in wanted else a for i, a in enumerate(args)))

    def call_list(self, inputs: Inputs) -> Any:
        if not torch_compat.is_current_stream_capturing():
            for i in self.wanted:
                inputs[i] = _host_copy(inputs[i])
        return boxing.run(self.compiled, inputs)
