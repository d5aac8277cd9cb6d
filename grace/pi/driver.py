"""The driver operations parameter indirection performs, on top of ``grace.compat.cuda``.

Problem: PI loads rewritten cubins, swaps the function of captured kernel nodes, rewrites their pointer
parameters, adds and removes nodes, allocates its pointer table and (for the torch-free stage suite)
launches, captures and instantiates kernels itself. Every call must check its result code; handles are
plain ints everywhere else.

Design: one driver layer. ``grace.compat.cuda`` owns the bindings: the driver module
(``require_driver``), result checking (``check``), the node and graph queries every part of grace uses
(``graph_nodes``, ``node_type``, ...) and every form that differs between cuda-bindings releases
(``graph_add_dependencies``, ``device_updatable_attribute``). This module adds only PI's own
operations, composed from those; it never wraps a ``grace.compat.cuda`` function under another name,
and nothing here knows torch. Kernel parameters are passed as raw little-endian bytes per parameter,
which is what the driver copies. Node parameters are edited in place: ``cuGraphKernelNodeGetParams``
hands back the node's own parameter array, the new bytes are written where it points, and
``cuGraphKernelNodeSetParams`` makes the driver copy them (this avoids building a parameter array
through the bindings' marshalling, which differs between cuda-bindings releases).

Invariant: the caller keeps every ``ParamBuffer`` alive until the launch or ``SetParams`` that uses it
has returned (the driver copies parameter values at that point).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grace.compat import cuda as cuda_compat

_MAX_DEFAULT_SHARED = 48 * 1024


@functools.cache
def device_count() -> int:
    """Number of CUDA devices, 0 when there is no driver, no bindings or no device."""
    try:
        drv = cuda_compat.require_driver()
        cuda_compat.check("cuInit", drv.cuInit(0))
        return int(cuda_compat.check("cuDeviceGetCount", drv.cuDeviceGetCount()))
    except Exception:
        return 0


@dataclass(frozen=True)
class LoadedKernel:
    module: int
    function: int


def load_kernel(image: bytes, name: str, shared: int = 0) -> LoadedKernel:
    """``cuModuleLoadData`` of a cubin (or PTX) and its function ``name``, opted into ``shared`` bytes."""
    drv = cuda_compat.require_driver()
    buffer = ctypes.create_string_buffer(image, len(image) + 1)
    module = cuda_compat.check("cuModuleLoadData", drv.cuModuleLoadData(ctypes.addressof(buffer)))
    function = cuda_compat.check("cuModuleGetFunction", drv.cuModuleGetFunction(module, name.encode()))
    if shared > _MAX_DEFAULT_SHARED:
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        cuda_compat.check("cuFuncSetAttribute", drv.cuFuncSetAttribute(function, attr, shared))
    return LoadedKernel(int(module), int(function))


def unload_module(module: int) -> None:
    drv = cuda_compat.require_driver()
    cuda_compat.check("cuModuleUnload", drv.cuModuleUnload(drv.CUmodule(module)))


def mem_alloc(nbytes: int) -> int:
    drv = cuda_compat.require_driver()
    return int(cuda_compat.check("cuMemAlloc", drv.cuMemAlloc(max(nbytes, 1))))


def mem_free(ptr: int) -> None:
    drv = cuda_compat.require_driver()
    cuda_compat.check("cuMemFree", drv.cuMemFree(drv.CUdeviceptr(ptr)))


def copy_to_device(dst: int, data: bytes) -> None:
    drv = cuda_compat.require_driver()
    buffer = ctypes.create_string_buffer(data, len(data))
    cuda_compat.check(
        "cuMemcpyHtoD", drv.cuMemcpyHtoD(drv.CUdeviceptr(dst), ctypes.addressof(buffer), len(data))
    )


def copy_from_device(src: int, nbytes: int) -> bytes:
    drv = cuda_compat.require_driver()
    buffer = ctypes.create_string_buffer(nbytes)
    cuda_compat.check(
        "cuMemcpyDtoH", drv.cuMemcpyDtoH(ctypes.addressof(buffer), drv.CUdeviceptr(src), nbytes)
    )
    return buffer.raw


class ParamBuffer:
    """A ``void*[]`` kernel parameter array over per-parameter byte buffers (kept alive here)."""

    def __init__(self, values: Sequence[bytes]) -> None:
        self._buffers = [ctypes.create_string_buffer(v, max(len(v), 1)) for v in values]
        self._array = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(b) for b in self._buffers])

    @property
    def address(self) -> int:
        return ctypes.addressof(self._array)

    def value(self, index: int) -> ctypes.Array[ctypes.c_char]:
        """The writable bytes of parameter ``index``: a later launch or ``SetParams`` sends what they hold."""
        return self._buffers[index]


def launch(
    function: int,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared: int,
    params: ParamBuffer,
    stream: int = 0,
) -> None:
    drv = cuda_compat.require_driver()
    cuda_compat.check(
        "cuLaunchKernel",
        drv.cuLaunchKernel(
            drv.CUfunction(function), *grid, *block, shared, drv.CUstream(stream), params.address, 0
        ),
    )


def synchronize() -> None:
    drv = cuda_compat.require_driver()
    cuda_compat.check("cuCtxSynchronize", drv.cuCtxSynchronize())


def new_stream() -> int:
    drv = cuda_compat.require_driver()
    flags = drv.CUstream_flags.CU_STREAM_NON_BLOCKING
    return int(cuda_compat.check("cuStreamCreate", drv.cuStreamCreate(flags)))


def capture_launch(
    function: int, grid: tuple[int, int, int], block: tuple[int, int, int], shared: int, params: ParamBuffer
) -> int:
    """A ``CUgraph`` with one kernel node, captured from a launch on a fresh stream."""
    drv = cuda_compat.require_driver()
    stream = new_stream()
    mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    cuda_compat.check("cuStreamBeginCapture", drv.cuStreamBeginCapture(drv.CUstream(stream), mode))
    try:
        launch(function, grid, block, shared, params, stream)
    finally:
        graph = cuda_compat.check("cuStreamEndCapture", drv.cuStreamEndCapture(drv.CUstream(stream)))
    cuda_compat.check("cuStreamDestroy", drv.cuStreamDestroy(drv.CUstream(stream)))
    return int(graph)


def instantiate(graph: int) -> int:
    drv = cuda_compat.require_driver()
    if hasattr(drv, "cuGraphInstantiateWithFlags"):  # CUDA 12 bindings
        return int(
            cuda_compat.check(
                "cuGraphInstantiateWithFlags", drv.cuGraphInstantiateWithFlags(drv.CUgraph(graph), 0)
            )
        )
    return int(
        cuda_compat.check("cuGraphInstantiate", drv.cuGraphInstantiate(drv.CUgraph(graph), 0))
    )  # CUDA 13: flags


def graph_launch(graph_exec: int, stream: int = 0) -> None:
    graph_launcher(graph_exec)(stream)


def graph_launcher(graph_exec: int) -> Callable[[int], None]:
    """A function that launches ``graph_exec`` on a stream (``cuGraphLaunch``); the handle and the bound
    call are made here, once, for a launch per replay."""
    drv = cuda_compat.require_driver()
    call, handle, stream_of = drv.cuGraphLaunch, drv.CUgraphExec(graph_exec), drv.CUstream
    success = drv.CUresult.CUDA_SUCCESS

    def launch(stream: int) -> None:
        result = call(handle, stream_of(stream))
        if result[0] != success:
            cuda_compat.check("cuGraphLaunch", result)

    return launch


def graph_upload(graph_exec: int, stream: int = 0) -> None:
    """``cuGraphUpload``: make the executable graph resident before its first launch on ``stream``."""
    drv = cuda_compat.require_driver()
    cuda_compat.check("cuGraphUpload", drv.cuGraphUpload(drv.CUgraphExec(graph_exec), drv.CUstream(stream)))


def graph_destroy(graph: int, graph_exec: int | None = None) -> None:
    drv = cuda_compat.require_driver()
    if graph_exec:
        cuda_compat.check("cuGraphExecDestroy", drv.cuGraphExecDestroy(drv.CUgraphExec(graph_exec)))
    cuda_compat.graph_destroy(graph)


def patch_kernel_node(node: int, function: int, new_params: dict[int, bytes]) -> None:
    """Make ``node`` launch ``function`` with parameter ``i`` replaced by ``new_params[i]``.

    Grid, block, shared memory and every other parameter stay as captured. The new bytes must have the
    parameter's size (8 for a pointer).
    """
    drv = cuda_compat.require_driver()
    handle = drv.CUgraphNode(node)
    params = cuda_compat.check("cuGraphKernelNodeGetParams", drv.cuGraphKernelNodeGetParams(handle))
    array = int(params.kernelParams or 0)
    if new_params and not array:
        raise RuntimeError(
            "kernel node passes its arguments through `extra`; its parameters cannot be patched"
        )
    for index, value in new_params.items():
        slot = ctypes.c_void_p.from_address(array + index * ctypes.sizeof(ctypes.c_void_p)).value
        if not slot:
            raise RuntimeError(f"kernel node has no parameter {index}")
        ctypes.memmove(slot, value, len(value))
    params.func = drv.CUfunction(function)
    if hasattr(params, "kern"):
        params.kern = drv.CUkernel(0)
    cuda_compat.check("cuGraphKernelNodeSetParams", drv.cuGraphKernelNodeSetParams(handle, params))


# --- graph nodes PI reads or adds ------------------------------------------------------------------


def copy_node_ranges(node: int, kind: str) -> tuple[tuple[int, int], ...]:
    """Device byte ranges a memcpy or memset node touches (generously: whole pitched extents)."""
    drv = cuda_compat.require_driver()
    handle = drv.CUgraphNode(node)
    ranges = []
    if kind == "memset":
        p = cuda_compat.check("cuGraphMemsetNodeGetParams", drv.cuGraphMemsetNodeGetParams(handle))
        start = int(p.dst)
        rows = max(int(p.height), 1)
        span = int(p.pitch) * (rows - 1) + int(p.width) * int(p.elementSize)
        ranges.append((start, start + span))
        return tuple(ranges)
    p = cuda_compat.check("cuGraphMemcpyNodeGetParams", drv.cuGraphMemcpyNodeGetParams(handle))
    rows = max(int(p.Height), 1) * max(int(p.Depth), 1)
    for side in ("src", "dst"):
        base = int(getattr(p, f"{side}Device") or 0)
        if not base:
            continue  # host memory or an array: not a device placeholder
        pitch = int(getattr(p, f"{side}Pitch") or 0) or int(p.WidthInBytes)
        start = base + int(getattr(p, f"{side}XInBytes") or 0) + pitch * int(getattr(p, f"{side}Y") or 0)
        ranges.append((start, start + pitch * (rows - 1) + int(p.WidthInBytes)))
    return tuple(ranges)


def make_device_updatable(node: int) -> int:
    """Mark a kernel node device-updatable and return its device-side handle (``CUgraphDeviceNode``)."""
    drv = cuda_compat.require_driver()
    attr, value_type = cuda_compat.device_updatable_attribute()
    value = value_type()
    value.deviceUpdatableKernelNode.deviceUpdatable = 1
    handle = drv.CUgraphNode(node)
    cuda_compat.check("cuGraphKernelNodeSetAttribute", drv.cuGraphKernelNodeSetAttribute(handle, attr, value))
    got = cuda_compat.check("cuGraphKernelNodeGetAttribute", drv.cuGraphKernelNodeGetAttribute(handle, attr))
    dev_node = int(got.deviceUpdatableKernelNode.devNode)
    if not dev_node:
        raise RuntimeError("the driver returned no device node handle for a device-updatable kernel node")
    return dev_node


def add_kernel_node(
    graph: int,
    function: int,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    params: ParamBuffer,
) -> int:
    """Add a root kernel node launching ``function`` with ``params`` to ``graph``.

    The launch is captured into a scratch graph first and its node's parameter struct (whose argument
    array the driver owns) is handed to ``cuGraphAddKernelNode``, which copies the arguments: no
    parameter array is marshalled through the bindings' struct setters.
    """
    drv = cuda_compat.require_driver()
    scratch = capture_launch(function, grid, block, 0, params)
    try:
        nodes = cuda_compat.graph_nodes(scratch)
        if len(nodes) != 1:
            raise RuntimeError(f"capturing one launch gave {len(nodes)} nodes")
        p = cuda_compat.check(
            "cuGraphKernelNodeGetParams", drv.cuGraphKernelNodeGetParams(drv.CUgraphNode(nodes[0]))
        )
        node = cuda_compat.check(
            "cuGraphAddKernelNode", drv.cuGraphAddKernelNode(drv.CUgraph(graph), None, 0, p)
        )
    finally:
        graph_destroy(scratch)
    return int(node)


def remove_node(node: int) -> None:
    """``cuGraphDestroyNode``: take ``node`` and its edges out of its (not yet instantiated) graph."""
    drv = cuda_compat.require_driver()
    cuda_compat.check("cuGraphDestroyNode", drv.cuGraphDestroyNode(drv.CUgraphNode(node)))
