"""The driver calls parameter indirection makes, on top of ``grace.compat.cuda`` (cuda-bindings).

Problem: PI loads rewritten cubins, swaps the function of captured kernel nodes, rewrites their pointer
parameters, allocates its pointer table and (for the torch-free stage suite) launches and captures
kernels itself. Every call must check its result code; handles are plain ints everywhere else.

Design: thin functions over ``grace.compat.cuda.driver()`` and its ``check``; nothing here knows torch.
Kernel parameters are passed as raw little-endian bytes per parameter, which is what the driver copies.
Node parameters are edited in place: ``cuGraphKernelNodeGetParams`` hands back the node's own parameter
array, the new bytes are written where it points, and ``cuGraphKernelNodeSetParams`` makes the driver
copy them (this avoids building a parameter array through the bindings' marshalling, which differs
between cuda-bindings releases).

Invariant: the caller keeps every ``ParamBuffer`` alive until the launch or ``SetParams`` that uses it
has returned (the driver copies parameter values at that point).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_MAX_DEFAULT_SHARED = 48 * 1024


def _cuda() -> Any:
    from grace.compat import cuda as cuda_compat

    return cuda_compat


def _drv() -> Any:
    drv = _cuda().driver()
    if drv is None:
        raise RuntimeError(f"cuda-bindings unavailable: {_cuda().import_error()}")
    return drv


def check(name: str, result: Any) -> Any:
    return _cuda().check(name, result)


@functools.cache
def device_count() -> int:
    """Number of CUDA devices, 0 when there is no driver, no bindings or no device."""
    try:
        drv = _drv()
        check("cuInit", drv.cuInit(0))
        return int(check("cuDeviceGetCount", drv.cuDeviceGetCount()))
    except Exception:
        return 0


def ensure_context(device: int = 0) -> int:
    """Make the device's primary context current (the one torch and Triton use); returns it."""
    drv = _drv()
    check("cuInit", drv.cuInit(0))
    dev = check("cuDeviceGet", drv.cuDeviceGet(device))
    ctx = check("cuDevicePrimaryCtxRetain", drv.cuDevicePrimaryCtxRetain(dev))
    check("cuCtxSetCurrent", drv.cuCtxSetCurrent(ctx))
    return int(ctx)


@dataclass(frozen=True)
class LoadedKernel:
    module: int
    function: int


def load_kernel(image: bytes, name: str, shared: int = 0) -> LoadedKernel:
    """``cuModuleLoadData`` of a cubin (or PTX) and its function ``name``, opted into ``shared`` bytes."""
    drv = _drv()
    buffer = ctypes.create_string_buffer(image, len(image) + 1)
    module = check("cuModuleLoadData", drv.cuModuleLoadData(ctypes.addressof(buffer)))
    function = check("cuModuleGetFunction", drv.cuModuleGetFunction(module, name.encode()))
    if shared > _MAX_DEFAULT_SHARED:
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check("cuFuncSetAttribute", drv.cuFuncSetAttribute(function, attr, shared))
    return LoadedKernel(int(module), int(function))


def unload_module(module: int) -> None:
    drv = _drv()
    check("cuModuleUnload", drv.cuModuleUnload(drv.CUmodule(module)))


def mem_alloc(nbytes: int) -> int:
    drv = _drv()
    return int(check("cuMemAlloc", drv.cuMemAlloc(max(nbytes, 1))))


def mem_free(ptr: int) -> None:
    drv = _drv()
    check("cuMemFree", drv.cuMemFree(drv.CUdeviceptr(ptr)))


def copy_to_device(dst: int, data: bytes) -> None:
    drv = _drv()
    buffer = ctypes.create_string_buffer(data, len(data))
    check("cuMemcpyHtoD", drv.cuMemcpyHtoD(drv.CUdeviceptr(dst), ctypes.addressof(buffer), len(data)))


def copy_from_device(src: int, nbytes: int) -> bytes:
    drv = _drv()
    buffer = ctypes.create_string_buffer(nbytes)
    check("cuMemcpyDtoH", drv.cuMemcpyDtoH(ctypes.addressof(buffer), drv.CUdeviceptr(src), nbytes))
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
    drv = _drv()
    check(
        "cuLaunchKernel",
        drv.cuLaunchKernel(
            drv.CUfunction(function), *grid, *block, shared, drv.CUstream(stream), params.address, 0
        ),
    )


def synchronize() -> None:
    drv = _drv()
    check("cuCtxSynchronize", drv.cuCtxSynchronize())


def new_stream() -> int:
    drv = _drv()
    flags = drv.CUstream_flags.CU_STREAM_NON_BLOCKING
    return int(check("cuStreamCreate", drv.cuStreamCreate(flags)))


def capture_launch(
    function: int, grid: tuple[int, int, int], block: tuple[int, int, int], shared: int, params: ParamBuffer
) -> int:
    """A ``CUgraph`` with one kernel node, captured from a launch on a fresh stream."""
    drv = _drv()
    stream = new_stream()
    mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    check("cuStreamBeginCapture", drv.cuStreamBeginCapture(drv.CUstream(stream), mode))
    try:
        launch(function, grid, block, shared, params, stream)
    finally:
        graph = check("cuStreamEndCapture", drv.cuStreamEndCapture(drv.CUstream(stream)))
    check("cuStreamDestroy", drv.cuStreamDestroy(drv.CUstream(stream)))
    return int(graph)


def instantiate(graph: int) -> int:
    drv = _drv()
    if hasattr(drv, "cuGraphInstantiateWithFlags"):  # CUDA 12 bindings
        return int(
            check("cuGraphInstantiateWithFlags", drv.cuGraphInstantiateWithFlags(drv.CUgraph(graph), 0))
        )
    return int(check("cuGraphInstantiate", drv.cuGraphInstantiate(drv.CUgraph(graph), 0)))  # CUDA 13: flags


def graph_launch(graph_exec: int, stream: int = 0) -> None:
    graph_launcher(graph_exec)(stream)


def graph_launcher(graph_exec: int) -> Callable[[int], None]:
    """A function that launches ``graph_exec`` on a stream (``cuGraphLaunch``); the handle and the bound
    call are made here, once, for a launch per replay."""
    drv = _drv()
    call, handle, stream_of = drv.cuGraphLaunch, drv.CUgraphExec(graph_exec), drv.CUstream
    success = drv.CUresult.CUDA_SUCCESS

    def launch(stream: int) -> None:
        result = call(handle, stream_of(stream))
        if result[0] != success:
            check("cuGraphLaunch", result)

    return launch


def graph_upload(graph_exec: int, stream: int = 0) -> None:
    """``cuGraphUpload``: make the executable graph resident before its first launch on ``stream``."""
    drv = _drv()
    check("cuGraphUpload", drv.cuGraphUpload(drv.CUgraphExec(graph_exec), drv.CUstream(stream)))


def graph_destroy(graph: int, graph_exec: int | None = None) -> None:
    drv = _drv()
    if graph_exec:
        check("cuGraphExecDestroy", drv.cuGraphExecDestroy(drv.CUgraphExec(graph_exec)))
    _cuda().graph_destroy(graph)


def graph_nodes(graph: int) -> list[int]:
    return [int(n) for n in _cuda().graph_nodes(graph)]


def patch_kernel_node(node: int, function: int, new_params: dict[int, bytes]) -> None:
    """Make ``node`` launch ``function`` with parameter ``i`` replaced by ``new_params[i]``.

    Grid, block, shared memory and every other parameter stay as captured. The new bytes must have the
    parameter's size (8 for a pointer).
    """
    drv = _drv()
    handle = drv.CUgraphNode(node)
    params = check("cuGraphKernelNodeGetParams", drv.cuGraphKernelNodeGetParams(handle))
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
    check("cuGraphKernelNodeSetParams", drv.cuGraphKernelNodeSetParams(handle, params))


# --- graph nodes PI reads or adds ------------------------------------------------------------------


def node_type(node: int) -> str:
    return str(_cuda().node_type(node))


def copy_node_ranges(node: int, kind: str) -> tuple[tuple[int, int], ...]:
    """Device byte ranges a memcpy or memset node touches (generously: whole pitched extents)."""
    drv = _drv()
    handle = drv.CUgraphNode(node)
    ranges = []
    if kind == "memset":
        p = check("cuGraphMemsetNodeGetParams", drv.cuGraphMemsetNodeGetParams(handle))
        start = int(p.dst)
        rows = max(int(p.height), 1)
        span = int(p.pitch) * (rows - 1) + int(p.width) * int(p.elementSize)
        ranges.append((start, start + span))
        return tuple(ranges)
    p = check("cuGraphMemcpyNodeGetParams", drv.cuGraphMemcpyNodeGetParams(handle))
    rows = max(int(p.Height), 1) * max(int(p.Depth), 1)
    for side in ("src", "dst"):
        base = int(getattr(p, f"{side}Device") or 0)
        if not base:
            continue  # host memory or an array: not a device placeholder
        pitch = int(getattr(p, f"{side}Pitch") or 0) or int(p.WidthInBytes)
        start = base + int(getattr(p, f"{side}XInBytes") or 0) + pitch * int(getattr(p, f"{side}Y") or 0)
        ranges.append((start, start + pitch * (rows - 1) + int(p.WidthInBytes)))
    return tuple(ranges)


_DEVICE_UPDATABLE = "DEVICE_UPDATABLE_KERNEL_NODE"


def _attribute_ids(drv: Any) -> tuple[Any, Any]:
    """The device-updatable attribute id and the node attribute value type, across bindings releases.

    ``cuGraphKernelNodeSetAttribute`` type-checks its value (``CUkernelNodeAttrValue``; verified on an
    H200 with cuda-bindings 13.3.1, where that is not the launch attribute value class) but takes the id
    by value, so the id may come from ``CUkernelNodeAttrID`` or ``CUlaunchAttributeID``.
    """
    value_type = getattr(drv, "CUkernelNodeAttrValue", None) or getattr(drv, "CUlaunchAttributeValue", None)
    if value_type is None:
        raise RuntimeError("these cuda-bindings have no kernel node attribute values (CUDA >= 12.4 needed)")
    for enum_name in ("CUkernelNodeAttrID", "CUlaunchAttributeID"):
        enum_type = getattr(drv, enum_name, None)
        for prefix in ("CU_LAUNCH_ATTRIBUTE_", "CU_KERNEL_NODE_ATTRIBUTE_"):
            member = getattr(enum_type, prefix + _DEVICE_UPDATABLE, None) if enum_type is not None else None
            if member is not None:
                return member, value_type
    raise RuntimeError("these cuda-bindings have no device-updatable kernel node attribute (CUDA >= 12.4)")


def make_device_updatable(node: int) -> int:
    """Mark a kernel node device-updatable and return its device-side handle (``CUgraphDeviceNode``)."""
    drv = _drv()
    attr, value_type = _attribute_ids(drv)
    value = value_type()
    value.deviceUpdatableKernelNode.deviceUpdatable = 1
    handle = drv.CUgraphNode(node)
    check("cuGraphKernelNodeSetAttribute", drv.cuGraphKernelNodeSetAttribute(handle, attr, value))
    got = check("cuGraphKernelNodeGetAttribute", drv.cuGraphKernelNodeGetAttribute(handle, attr))
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
    drv = _drv()
    scratch = capture_launch(function, grid, block, 0, params)
    try:
        nodes = graph_nodes(scratch)
        if len(nodes) != 1:
            raise RuntimeError(f"capturing one launch gave {len(nodes)} nodes")
        p = check("cuGraphKernelNodeGetParams", drv.cuGraphKernelNodeGetParams(drv.CUgraphNode(nodes[0])))
        node = check("cuGraphAddKernelNode", drv.cuGraphAddKernelNode(drv.CUgraph(graph), None, 0, p))
    finally:
        graph_destroy(scratch)
    return int(node)


def remove_node(node: int) -> None:
    """``cuGraphDestroyNode``: take ``node`` and its edges out of its (not yet instantiated) graph."""
    drv = _drv()
    check("cuGraphDestroyNode", drv.cuGraphDestroyNode(drv.CUgraphNode(node)))


def add_dependencies(graph: int, before: int, after: Sequence[int]) -> None:
    """Edges ``before -> a`` for every ``a`` in ``after`` (the 4- and 5-argument forms of the call)."""
    drv = _drv()
    if not after:
        return
    src = [drv.CUgraphNode(before)] * len(after)
    dst = [drv.CUgraphNode(a) for a in after]
    g = drv.CUgraph(graph)
    try:
        result = drv.cuGraphAddDependencies(g, src, dst, len(after))
    except TypeError:  # CUDA 13 bindings: (graph, from, to, edgeData, count)
        result = drv.cuGraphAddDependencies(g, src, dst, None, len(after))
    check("cuGraphAddDependencies", result)
