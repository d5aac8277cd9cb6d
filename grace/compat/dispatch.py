"""What the dispatcher sees when an FX graph runs on fake tensors: the inputs it writes, its random ops.

Problem: which inputs a Dynamo graph mutates cannot be read from operator names (``_foreach_add_``
starts with an underscore, a ``torch.library`` op's name says nothing, ``out=`` and ``copy_`` through a
view write memory that belongs to an input). Each op's schema says it: an argument whose alias
annotation is a write (``Tensor(a!)``, ``Tensor(a!)[]``). Dynamo's graphs call torch functions, tensor
methods and op packets, which resolve to schemas only when dispatched.

Design: ``trace_effects`` runs the graph once on fake copies of its example inputs (a fresh
``FakeTensorMode``: no device work, no real memory) under a dispatch mode that sees every
``OpOverload``. Each written argument is mapped to the storage it lives in; storages of the fake inputs
map back to input indices, so writes through views, ``out=`` and lists of tensors are found. A write to
a storage that is neither an input's nor one an op of this run created (a constant the graph reads
through ``get_attr``, a global) is reported as unattributed. Ops tagged ``nondeterministic_seeded`` are
the graph's random ops (attention kernels only with a dropout probability that is not 0), and so is
every op of a namespace other than torch's own (a custom op's schema does not say whether it draws).
The batch norms update their running statistics without saying so in their schemas: a short table adds
those writes. A higher-order operator is opaque here: every tensor it is given counts as written and
its name as a random op, so nothing is missed.

Invariant: the result over-approximates the graph's writes; any failure of the run raises, and the
caller must then treat the graph's mutations as unknown (never as none). This is the one module that
knows torch's fake tensors, dispatch modes and storage references.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass(frozen=True)
class GraphEffects:
    """What one run of a graph on fake tensors did: ``written`` input indices, ``random_ops`` (names of
    ops that draw from a generator), ``unattributed`` (ops that wrote memory no input or op of the run
    owns) and ``opaque`` (higher-order ops whose tensors were all taken as written)."""

    written: tuple[int, ...]
    random_ops: tuple[str, ...]
    unattributed: tuple[str, ...]
    opaque: tuple[str, ...]


class _EffectsMode(TorchDispatchMode):
    """Records the storages each op writes and creates, and the random ops, then runs the op."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, StorageWeakRef]] = []
        self.created: set[StorageWeakRef] = set()
        self.random: list[str] = []
        self.opaque: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.OpOverload):
            name = str(func)
            for value in _written_arguments(func, args, kwargs):
                self.writes.extend((name, ref) for ref in _storages(value))
            if _draws(func, args, kwargs):
                self.random.append(name)
        else:  # a higher-order operator: its body is not seen op by op
            name = str(getattr(func, "_name", func))
            self.opaque.append(name)
            self.random.append(name)
            self.writes.extend((name, ref) for ref in _storages((args, kwargs)))
        result = func(*args, **kwargs)
        self.created.update(_storages(result))
        return result


# Namespaces whose ops carry the ``nondeterministic_seeded`` tag when they draw random numbers.
_KNOWN_NAMESPACES = frozenset(
    {
        "aten", "prims", "prim", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd",
        "quantized", "_quantized", "quantized_decomposed", "mkldnn", "onednn",
    }
)  # fmt: skip

# Ops whose schemas do not annotate arguments they write: (argument names, the bool argument that
# must be true for the write). The batch norms update their running statistics when training.
_UNDECLARED_WRITES: dict[str, tuple[tuple[str, ...], str]] = {
    "aten::native_batch_norm": (("running_mean", "running_var"), "training"),
    "aten::cudnn_batch_norm": (("running_mean", "running_var"), "training"),
    "aten::miopen_batch_norm": (("running_mean", "running_var"), "training"),
    "aten::batch_norm": (("running_mean", "running_var"), "training"),
    "aten::_batch_norm_impl_index": (("running_mean", "running_var"), "training"),
}


def _argument_values(
    func: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The arguments given to ``func`` by name (defaults left out)."""
    values: dict[str, Any] = {}
    for position, argument in enumerate(func._schema.arguments):
        if argument.name in kwargs:
            values[argument.name] = kwargs[argument.name]
        elif not argument.kwarg_only and position < len(args):
            values[argument.name] = args[position]
    return values


def _draws(func: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` may draw from a generator: tagged so (attention kernels only when their
    ``dropout_p`` is not 0: they draw for dropout alone), or an op of a library's own, which may draw
    without saying so."""
    if func.namespace not in _KNOWN_NAMESPACES:
        return True
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    for argument in func._schema.arguments:
        if argument.name == "dropout_p":
            value = _argument_values(func, args, kwargs).get("dropout_p", argument.default_value)
            return not (isinstance(value, (int, float)) and value == 0)
    return True


def _written_arguments(func: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    schema = func._schema
    values = _argument_values(func, args, kwargs)
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    undeclared = _UNDECLARED_WRITES.get(schema.name)
    if undeclared is not None and values.get(undeclared[1], True) is not False:
        written.extend(undeclared[0])
    return [values[name] for name in written if name in values]


def _storages(value: Any) -> list[StorageWeakRef]:
    refs = []
    for leaf in tree_flatten(value)[0]:
        if isinstance(leaf, torch.Tensor):
            refs.append(StorageWeakRef(leaf.untyped_storage()))
    return refs


def _fake_input(mode: FakeTensorMode, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return mode.from_tensor(value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        hint = value.node.hint
        if hint is None:
            raise ValueError(f"a symbolic input ({value}) has no value to run the graph with")
        return hint
    return value


def trace_effects(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> GraphEffects:
    """Run ``gm`` on fake copies of ``example_inputs`` and report what it wrote (see the module
    docstring). Raises whatever the run raises: the caller treats that as unknown mutations."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [_fake_input(mode, v) for v in example_inputs]
    inputs: dict[StorageWeakRef, list[int]] = {}
    for index, fake in enumerate(fakes):
        if isinstance(fake, torch.Tensor):
            inputs.setdefault(StorageWeakRef(fake.untyped_storage()), []).append(index)
    recorder = _EffectsMode()
    with mode, recorder:
        gm(*fakes)
    written: set[int] = set()
    unattributed: list[str] = []
    for name, ref in recorder.writes:
        if ref in inputs:
            written.update(inputs[ref])
        elif ref not in recorder.created and name not in unattributed:
            unattributed.append(name)
    return GraphEffects(
        written=tuple(sorted(written)),
        random_ops=tuple(dict.fromkeys(recorder.random)),
        unattributed=tuple(unattributed),
        opaque=tuple(dict.fromkeys(recorder.opaque)),
    )
