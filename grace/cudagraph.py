"""Driver-level view of a CUDA graph: its nodes, kernel functions, grids and raw parameter bytes.

Problem: PI and the stats need to see inside a captured graph: which kernels it launches, with which
grid, and where each pointer argument sits in the parameter bytes (Triton kernels pass arguments through
``kernelParams``; cuBLAS passes one struct through ``extra``, DESIGN 3.4).

Design: ``graph_summary(handle)`` counts nodes by type; ``kernel_nodes(handle)`` returns one frozen
``KernelNode`` per kernel node with the function name, grid, block, each parameter's (offset, size) from
``cuFuncGetParamInfo`` and its raw bytes, or the ``extra`` buffer's bytes. Memory reads go through
``read_kernel_params`` and ``read_extra_buffer``, which take plain host addresses so that they can be
tested on host memory without a GPU. ``edit_kernel_node_arguments`` overwrites argument bytes of a node
(grace.rebind moves the addresses of a graph's parameters with it).

Invariants: a handle is only read while its graph exists (inside the capture on old torch, before
``reset`` on new torch); parameter bytes are copies (the node's memory is owned by the driver and may
move on the next ``SetParams``).
"""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grace.compat import cuda as cuda_compat

_POINTER_SIZE = ctypes.sizeof(ctypes.c_void_p)
_MAX_PARAMS = 4096  # far above any kernel; guards against a runaway loop on a bad function handle


@dataclass(frozen=True)
class KernelParam:
    """One kernel parameter: its place in the device-side layout and its bytes at capture time."""

    index: int
    offset: int
    size: int
    raw: bytes

    def as_pointer(self) -> int | None:
        """The value as a little-endian 8-byte address, when the parameter is 8 bytes."""
        return int.from_bytes(self.raw, "little") if self.size == _POINTER_SIZE else None


@dataclass(frozen=True)
class KernelNode:
    """A kernel node of a graph, as the driver reports it."""

    node: int
    function: int
    name: str | None
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem_bytes: int
    params: tuple[KernelParam, ...]
    extra: bytes | None  # the ``CU_LAUNCH_PARAM_BUFFER_POINTER`` buffer when launched through ``extra``

    @property
    def uses_extra(self) -> bool:
        return self.extra is not None


@dataclass(frozen=True)
class GraphSummary:
    nodes: int
    by_type: dict[str, int]

    @property
    def kernel_nodes(self) -> int:
        return self.by_type.get("kernel", 0)


def graph_summary(graph: int) -> GraphSummary:
    """Count the nodes of ``graph`` by type (``kernel``, ``memcpy``, ``memset``, ...)."""
    nodes = cuda_compat.graph_nodes(graph)
    counts = Counter(cuda_compat.node_type(n) for n in nodes)
    return GraphSummary(nodes=len(nodes), by_type=dict(counts))


def param_layout(function: int) -> list[tuple[int, int]]:
    """(offset, size) of every parameter of ``function``; empty when the driver cannot tell."""
    if not function or not cuda_compat.has_param_info():
        return []
    layout = []
    for index in range(_MAX_PARAMS):
        info = cuda_compat.param_info(function, index)
        if info is None:
            break
        layout.append(info)
    return layout


def read_kernel_params(kernel_params: int, sizes: list[int]) -> list[bytes]:
    """Bytes of each parameter from a ``void**`` array (one pointer per parameter)."""
    if not kernel_params:
        return []
    out = []
    for index, size in enumerate(sizes):
        pointer = ctypes.c_void_p.from_address(kernel_params + index * _POINTER_SIZE).value
        out.append(ctypes.string_at(pointer, size) if pointer else b"")
    return out


def read_extra_buffer(extra: int) -> bytes | None:
    """The argument buffer of a ``cuLaunchKernel`` ``extra`` array, or None when there is none.

    The array holds (key, value) pointer pairs ended by ``CU_LAUNCH_PARAM_END``; the buffer is the value of
    ``CU_LAUNCH_PARAM_BUFFER_POINTER`` and its size the ``size_t`` that ``CU_LAUNCH_PARAM_BUFFER_SIZE``
    points to.
    """
    if not extra:
        return None
    buffer = size = None
    for slot in range(0, 64, 2):
        key = ctypes.c_void_p.from_address(extra + slot * _POINTER_SIZE).value or 0
        if key in (cuda_compat.LAUNCH_PARAM_END, cuda_compat.LAUNCH_PARAM_END_AS_INT):
            break
        value = ctypes.c_void_p.from_address(extra + (slot + 1) * _POINTER_SIZE).value or 0
        if key == cuda_compat.LAUNCH_PARAM_BUFFER_POINTER:
            buffer = value
        elif key == cuda_compat.LAUNCH_PARAM_BUFFER_SIZE and value:
            size = ctypes.c_size_t.from_address(value).value
    if not buffer or size is None:
        return None
    return ctypes.string_at(buffer, size)


def kernel_nodes(graph: int) -> list[KernelNode]:
    """Every kernel node of ``graph`` with its function, grid and parameter bytes."""
    result = []
    for node in cuda_compat.graph_nodes(graph):
        if cuda_compat.node_type(node) != "kernel":
            continue
        fields = cuda_compat.kernel_node_params(node)
        function = cuda_compat.function_of(fields["func"], fields["kern"])
        layout = param_layout(function)
        params: tuple[KernelParam, ...] = ()
        extra = None
        if fields["kernel_params"] and layout:
            raws = read_kernel_params(fields["kernel_params"], [size for _, size in layout])
            params = tuple(
                KernelParam(index=i, offset=off, size=size, raw=raw)
                for i, ((off, size), raw) in enumerate(zip(layout, raws, strict=True))
            )
        elif fields["extra"]:
            extra = read_extra_buffer(fields["extra"])
            if extra is not None and layout:
                params = tuple(
                    KernelParam(index=i, offset=off, size=size, raw=extra[off : off + size])
                    for i, (off, size) in enumerate(layout)
                )
        result.append(
            KernelNode(
                node=node,
                function=function,
                name=cuda_compat.function_name(function),
                grid=fields["grid"],
                block=fields["block"],
                shared_mem_bytes=fields["shared_mem_bytes"],
                params=params,
                extra=extra,
            )
        )
    return result


@dataclass(frozen=True)
class ArgumentEdit:
    """New bytes for a kernel node's arguments at ``byte_offset`` of the device-side argument layout,
    inside parameter ``param_index`` (which starts at ``param_offset``; None: unknown, ``extra`` only)."""

    param_index: int | None
    param_offset: int
    byte_offset: int
    value: bytes


def extra_arguments(data: bytes) -> tuple[int, list[Any]]:
    """A ``cuLaunchKernel`` ``extra`` array over a copy of the argument buffer ``data``: its address and
    the objects that must stay alive while the driver may read it (the first is the buffer's copy)."""
    copy = ctypes.create_string_buffer(data, len(data))
    size = ctypes.c_size_t(len(data))
    array = (ctypes.c_void_p * 5)(
        cuda_compat.LAUNCH_PARAM_BUFFER_POINTER,
        ctypes.addressof(copy),
        cuda_compat.LAUNCH_PARAM_BUFFER_SIZE,
        ctypes.addressof(size),
        cuda_compat.LAUNCH_PARAM_END,
    )
    return ctypes.addressof(array), [copy, size, array]


def edit_kernel_node_arguments(node: int, edits: Sequence[ArgumentEdit]) -> None:
    """Overwrite bytes of a kernel node's arguments; function, grid, block and shared memory stay.

    A node launched with ``kernelParams`` is edited in its own argument array, as the driver hands it
    out, and ``cuGraphKernelNodeSetParams`` copies it back (as grace.pi.driver does). A node launched
    through ``extra`` gets a new argument buffer: a copy of its own with the edits.
    """
    drv = cuda_compat.driver()
    if drv is None:
        raise cuda_compat.CudaDriverError(f"cuda-bindings unavailable: {cuda_compat.import_error()}")
    handle = drv.CUgraphNode(node)
    params = cuda_compat.check("cuGraphKernelNodeGetParams", drv.cuGraphKernelNodeGetParams(handle))
    array = int(params.kernelParams or 0)
    keep: list[Any] = []
    if array:
        for edit in edits:
            if edit.param_index is None:
                raise cuda_compat.CudaDriverError("an edit of a kernelParams node needs its parameter")
            slot = ctypes.c_void_p.from_address(array + edit.param_index * _POINTER_SIZE).value
            if not slot:
                raise cuda_compat.CudaDriverError(f"kernel node has no parameter {edit.param_index}")
            ctypes.memmove(slot + edit.byte_offset - edit.param_offset, edit.value, len(edit.value))
    else:
        buffer = read_extra_buffer(int(params.extra or 0))
        if buffer is None:
            raise cuda_compat.CudaDriverError("kernel node has neither kernelParams nor an argument buffer")
        data = bytearray(buffer)
        for edit in edits:
            end = edit.byte_offset + len(edit.value)
            if edit.byte_offset < 0 or end > len(data):
                raise cuda_compat.CudaDriverError(
                    f"edit at byte {edit.byte_offset} is outside the {len(data)}-byte argument buffer"
                )
            data[edit.byte_offset : end] = edit.value
        params.extra, keep = extra_arguments(bytes(data))
    cuda_compat.check("cuGraphKernelNodeSetParams", drv.cuGraphKernelNodeSetParams(handle, params))
    del keep  # the driver has copied the arguments
