"""What CGCT knows about operators: which ones sync, copy between devices, draw random numbers, or
give bit-identical results on the CPU and on a GPU.

Problem: CGCT decides from the ATen ops a graph node dispatched (recorded by grace.cgct.analysis),
so one table covers Dynamo graphs (``torch.arange``, ``x.to(...)``) and ATen graphs
(``aten.arange.start``) alike. Moving CPU work to the GPU must not change values: a float ``arange``
accumulates in double on the CPU and in float on CUDA; Triton may fuse a multiply and an add into an
FMA. So only ops that are exact on both devices may run on the GPU instead of the CPU.

Design: op identities are the packet names ``namespace.name`` (``aten.nonzero``), compared as strings
so the tables do not depend on which overloads a torch release has.

Invariant: ``EXACT_ANY_DTYPE`` holds only ops whose results are bit-identical on every device for
every dtype (data movement, comparisons, selection); ``EXACT_INTEGRAL`` holds ops that are exact
when every tensor they produce has an integral or bool dtype.
"""

from __future__ import annotations

import torch

from grace.compat import dynamo as compat

SYNC_OPS = frozenset(
    {
        "aten._local_scalar_dense",
        "aten.item",
        "aten.nonzero",
        "aten.nonzero_numpy",
        "aten.argwhere",
        "aten.masked_select",
        "aten.unique",
        "aten._unique",
        "aten._unique2",
        "aten.unique_consecutive",
        "aten.unique_dim",
        "aten.equal",
        "aten.is_nonzero",
        "aten.allclose",
        "aten.repeat_interleave",
        "aten._assert_async",
        "aten.tolist",
    }
)
"""Ops whose output shape or value the host must read from the device."""

SYNC_METHODS = frozenset({"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "nonzero"})

COPY_OPS = frozenset(
    {
        "aten._to_copy",
        "aten.to",
        "aten.copy_",
        "aten._copy_from",
        "aten._copy_from_and_resize",
        "aten.empty",
        "aten.empty_strided",
        "aten.empty_like",
        "aten.detach",
        "aten.alias",
        "aten.clone",
        "aten.lift_fresh",
        "aten.lift_fresh_copy",
        "aten._pin_memory",
    }
)
"""What a host/device copy dispatches (a node made only of these that changes device is a copy)."""

EXACT_ANY_DTYPE = frozenset(
    {
        # data movement and views
        "aten.view",
        "aten._unsafe_view",
        "aten.reshape",
        "aten.expand",
        "aten.expand_as",
        "aten.unsqueeze",
        "aten.squeeze",
        "aten.permute",
        "aten.transpose",
        "aten.t",
        "aten.slice",
        "aten.select",
        "aten.narrow",
        "aten.as_strided",
        "aten.alias",
        "aten.unbind",
        "aten.split",
        "aten.split_with_sizes",
        "aten.chunk",
        "aten.flatten",
        "aten.unflatten",
        "aten.clone",
        "aten.contiguous",
        "aten._to_copy",
        "aten.to",
        "aten.copy_",
        "aten.cat",
        "aten.stack",
        "aten.repeat",
        "aten.index_select",
        "aten.gather",
        "aten.index",
        "aten.flip",
        "aten.roll",
        "aten.diagonal",
        "aten.tril",
        "aten.triu",
        "aten.detach",
        "aten.lift_fresh",
        "aten.lift_fresh_copy",
        # constants
        "aten.scalar_tensor",
        "aten.ones",
        "aten.zeros",
        "aten.full",
        "aten.empty",
        "aten.empty_strided",
        "aten.ones_like",
        "aten.zeros_like",
        "aten.full_like",
        "aten.empty_like",
        "aten.new_ones",
        "aten.new_zeros",
        "aten.new_full",
        "aten.new_empty",
        "aten.new_empty_strided",
        "aten.fill",
        "aten.fill_",
        "aten.zero_",
        "aten.eye",
        # selection and comparison
        "aten.where",
        "aten.masked_fill",
        "aten.masked_fill_",
        "aten.eq",
        "aten.ne",
        "aten.lt",
        "aten.le",
        "aten.gt",
        "aten.ge",
        "aten.logical_and",
        "aten.logical_or",
        "aten.logical_not",
        "aten.logical_xor",
        "aten.neg",
        "aten.abs",
        "aten.sign",
        "aten.maximum",
        "aten.minimum",
        "aten.clamp",
        "aten.clamp_min",
        "aten.clamp_max",
        "aten.floor",
        "aten.ceil",
        "aten.trunc",
        "aten.round",
        # size queries
        "aten.sym_size",
        "aten.sym_stride",
        "aten.sym_numel",
        "aten.sym_storage_offset",
        "aten.dim",
        "aten.size",
        "aten.stride",
        "aten.numel",
    }
)

EXACT_INTEGRAL = frozenset(
    {
        "aten.arange",
        "aten.range",
        "aten.add",
        "aten.add_",
        "aten.sub",
        "aten.sub_",
        "aten.mul",
        "aten.mul_",
        "aten.floor_divide",
        "aten.div",
        "aten.remainder",
        "aten.fmod",
        "aten.bitwise_and",
        "aten.bitwise_or",
        "aten.bitwise_xor",
        "aten.bitwise_not",
        "aten.cumsum",
        "aten.sum",
        "aten.prod",
        "aten.max",
        "aten.min",
        "aten.amax",
        "aten.amin",
        "aten.argmax",
        "aten.argmin",
        "aten.pow",
    }
)

FACTORY_CALLABLES = frozenset(
    {"arange", "ones", "zeros", "full", "empty", "empty_strided", "scalar_tensor", "eye", "tensor"}
)
"""Names of ``torch.*`` / ``aten.*`` factories that take a ``device`` keyword."""

_RANDOM_NAME_PARTS = ("rand", "normal", "bernoulli", "multinomial", "uniform", "exponential", "cauchy")
_RANDOM_NAME_PARTS_2 = ("geometric", "log_normal", "random", "poisson", "dropout", "rrelu")


def op_name(op: object) -> str:
    """``aten.nonzero`` for ``aten.nonzero.default``; the qualified name for other callables."""
    packet = getattr(op, "_overloadpacket", None)
    if packet is not None:
        return str(packet)
    name = str(op)
    return name


def is_random(op: object) -> bool:
    tag = getattr(torch.Tag, "nondeterministic_seeded", None)
    if tag is not None and tag in getattr(op, "tags", ()):
        return True
    name = op_name(op).rsplit(".", 1)[-1]
    return any(part in name for part in (*_RANDOM_NAME_PARTS, *_RANDOM_NAME_PARTS_2))


def is_sync(op: object) -> bool:
    return op_name(op) in SYNC_OPS


def is_forbidden_in_graphs(op: object) -> bool:
    """Ops Inductor never records into a CUDA graph (its own list or the op tag)."""
    forbidden = compat.forbidden_cudagraph_ops()
    return str(op) in forbidden or op_name(op) in forbidden or compat.has_cudagraph_unsafe_tag(op)


def is_exact(op: object, integral_outputs: bool) -> bool:
    name = op_name(op)
    return name in EXACT_ANY_DTYPE or (integral_outputs and name in EXACT_INTEGRAL)


def is_integral(dtype: torch.dtype) -> bool:
    return dtype == torch.bool or not (dtype.is_floating_point or dtype.is_complex)


def callable_name(target: object) -> str:
    """``arange`` for ``torch.arange`` and ``aten.arange.start``; the method name for call_method."""
    if isinstance(target, str):
        return target
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        return str(getattr(packet, "__name__", packet)).rsplit(".", 1)[-1]
    return str(getattr(target, "__name__", target))
