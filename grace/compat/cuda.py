"""The CUDA driver API through cuda-bindings, whatever its release.

Problem: grace reads and edits CUDA graphs at the driver level (kernel nodes, their functions and
parameters, the graph being captured). cuda-bindings moved its modules (``cuda.cuda`` up to 12.x,
``cuda.bindings.driver`` from 12.6 on) and some entry points need a recent driver
(``cuFuncGetParamInfo``: 12.4; ``cuFuncGetName``: 12.3).

Design: ``driver()`` returns the driver module or None (``import_error()`` says why); the helpers take
and return plain ``int`` handles, unwrap the ``(CUresult, *values)`` tuples and raise ``CudaDriverError``
with the function's and the error's names. Capabilities (``has_param_info()``,
``has_exec_kernel_node_set_params()``) are probed once; the host-side update of an instantiated graph's
kernel node (``exec_kernel_node_setter``) is bound once and then costs one bindings call.

Invariant: importing this module never loads libcuda; only calling a helper does.
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

# cuLaunchKernel ``extra`` markers (cuda.h): CU_LAUNCH_PARAM_END, _BUFFER_POINTER, _BUFFER_SIZE.
LAUNCH_PARAM_END = 0x00
LAUNCH_PARAM_BUFFER_POINTER = 0x01
LAUNCH_PARAM_BUFFER_SIZE = 0x02
LAUNCH_PARAM_END_AS_INT = 0x03

_import_error: str | None = None


class CudaDriverError(RuntimeError):
    """A driver call failed; the message names the call and the CUDA error."""


@functools.cache
def driver() -> Any:
    """The cuda-bindings driver module, or None when cuda-bindings is not installed."""
    global _import_error
    errors = []
    for name in ("cuda.bindings.driver", "cuda.cuda"):
        try:
            return importlib.import_module(name)
        except Exception as exc:  # ImportError, or a broken install
            errors.append(f"{name}: {exc}")
    _import_error = "; ".join(errors) + " (install the 'gpu' extra: cuda-bindings)"
    return None


def import_error() -> str | None:
    driver()
    return _import_error


def bindings_version() -> str | None:
    for name in ("cuda.bindings", "cuda"):
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        version = getattr(mod, "__version__", None)
        if version:
            return str(version)
    return None


def require_driver() -> Any:
    """The driver module; raises ``CudaDriverError`` (saying why) when cuda-bindings is not available."""
    drv = driver()
    if drv is None:
        raise CudaDriverError(f"cuda-bindings is not available: {import_error()}")
    return drv


def check(name: str, result: Any) -> Any:
    """Unwrap a cuda-bindings result tuple ``(CUresult, *values)``; raise on an error code."""
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    code = int(err)
    if code != 0:
        drv = driver()
        detail = str(err)
        if drv is not None:
            try:
                msg = drv.cuGetErrorString(err)
                if int(msg[0]) == 0 and msg[1]:
                    detail = f"{err} ({msg[1].decode(errors='replace')})"
            except Exception:
                pass
        raise CudaDriverError(f"{name} failed: {detail}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


_thread_devices = threading.local()


def ensure_context_current(device_index: int) -> None:
    """Make ``device_index``'s primary context current in the calling thread when no context is.

    The runtime API makes it current lazily, on a thread's first runtime call; a thread whose first CUDA
    work is a replay through grace reaches the driver calls (node parameter updates, graph launches)
    with no current context, which the driver does not survive. Checked once per thread and device; a
    thread that has a context (of any device) keeps it.
    """
    seen: set[int] | None = getattr(_thread_devices, "seen", None)
    if seen is None:
        seen = _thread_devices.seen = set()
    if device_index in seen:
        return
    drv = driver()
    if drv is not None:
        current = check("cuCtxGetCurrent", drv.cuCtxGetCurrent())
        if current is None or int(current) == 0:
            _set_primary_context(drv, device_index)
    seen.add(device_index)


def make_primary_context_current(device_index: int = 0) -> int:
    """Initialise the driver and make the device's primary context (the one torch and Triton use)
    current, whatever is current now; returns it (for callers without torch, such as the stage suite)."""
    drv = require_driver()
    check("cuInit", drv.cuInit(0))
    return _set_primary_context(drv, device_index)


def _set_primary_context(drv: Any, device_index: int) -> int:
    device = check("cuDeviceGet", drv.cuDeviceGet(device_index))
    primary = check("cuDevicePrimaryCtxRetain", drv.cuDevicePrimaryCtxRetain(device))
    check("cuCtxSetCurrent", drv.cuCtxSetCurrent(primary))
    return int(primary)


@functools.cache
def driver_version() -> int | None:
    """``cuDriverGetVersion`` (e.g. 13000 for 13.0), or None when it cannot be asked."""
    drv = driver()
    if drv is None:
        return None
    try:
        return int(check("cuDriverGetVersion", drv.cuDriverGetVersion()))
    except Exception:
        return None


@functools.cache
def has_param_info() -> bool:
    """``cuFuncGetParamInfo`` is in the bindings and the driver (CUDA >= 12.4)."""
    drv = driver()
    version = driver_version()
    return drv is not None and hasattr(drv, "cuFuncGetParamInfo") and version is not None and version >= 12040


def capturing_graph(stream_handle: int) -> int:
    """The ``CUgraph`` being captured on ``stream_handle`` (``cuStreamGetCaptureInfo``).

    The way to reach the graph on torch releases without ``keep_graph`` (DESIGN 3.2). The handle is owned
    by the capture: valid until the capture ends.
    """
    drv = require_driver()
    result = drv.cuStreamGetCaptureInfo(drv.CUstream(stream_handle))
    code = int(result[0])
    if code != 0:
        check("cuStreamGetCaptureInfo", result)
    status, graph = result[1], result[3]
    if int(status) != int(drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE):
        raise CudaDriverError(f"cuStreamGetCaptureInfo: stream is not capturing (status {status})")
    return int(graph)


def _node_list(name: str, graph: int) -> list[int]:
    drv = require_driver()
    call = getattr(drv, name)
    handle = drv.CUgraph(graph)
    _, count = check(name, call(handle, 0))
    if not count:
        return []
    nodes, _ = check(name, call(handle, count))
    return [int(n) for n in nodes[:count]]


def graph_nodes(graph: int) -> list[int]:
    return _node_list("cuGraphGetNodes", graph)


def graph_root_nodes(graph: int) -> list[int]:
    """The nodes of ``graph`` that depend on no other node (``cuGraphGetRootNodes``)."""
    return _node_list("cuGraphGetRootNodes", graph)


def node_type(node: int) -> str:
    """Lower-case node type without prefix: ``kernel``, ``memcpy``, ``memset``, ``graph``, ..."""
    drv = require_driver()
    kind = check("cuGraphNodeGetType", drv.cuGraphNodeGetType(drv.CUgraphNode(node)))
    name = getattr(kind, "name", str(kind))
    return name.replace("CU_GRAPH_NODE_TYPE_", "").lower()


def kernel_node_params(node: int) -> dict[str, Any]:
    """The fields of ``CUDA_KERNEL_NODE_PARAMS`` as ints: func, kern, grid, block, shared memory, and
    the addresses of the ``kernelParams`` and ``extra`` arrays (owned by the node)."""
    drv = require_driver()
    params = check("cuGraphKernelNodeGetParams", drv.cuGraphKernelNodeGetParams(drv.CUgraphNode(node)))
    return {
        "func": int(params.func),
        "kern": int(getattr(params, "kern", 0) or 0),
        "grid": (int(params.gridDimX), int(params.gridDimY), int(params.gridDimZ)),
        "block": (int(params.blockDimX), int(params.blockDimY), int(params.blockDimZ)),
        "shared_mem_bytes": int(params.sharedMemBytes),
        "kernel_params": int(params.kernelParams or 0),
        "extra": int(params.extra or 0),
    }


def function_of(func: int, kern: int) -> int:
    """The ``CUfunction`` a node launches: ``func``, else the one of its ``CUkernel`` in this context."""
    if func:
        return func
    if not kern:
        return 0
    drv = require_driver()
    return int(check("cuKernelGetFunction", drv.cuKernelGetFunction(drv.CUkernel(kern))))


def function_name(func: int) -> str | None:
    drv = require_driver()
    if not func or not hasattr(drv, "cuFuncGetName"):
        return None
    try:
        name = check("cuFuncGetName", drv.cuFuncGetName(drv.CUfunction(func)))
    except CudaDriverError:
        return None
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


def param_info(func: int, index: int) -> tuple[int, int] | None:
    """(offset, size) of parameter ``index`` of ``func``; None past the last parameter."""
    drv = require_driver()
    result = drv.cuFuncGetParamInfo(drv.CUfunction(func), index)
    if int(result[0]) != 0:
        return None
    return int(result[1]), int(result[2])


def graph_clone(graph: int) -> int:
    """``cuGraphClone``: a new graph with copies of ``graph``'s nodes, edges and parameters (the caller
    destroys it with ``graph_destroy``)."""
    drv = require_driver()
    return int(check("cuGraphClone", drv.cuGraphClone(drv.CUgraph(graph))))


def graph_destroy(graph: int) -> None:
    drv = require_driver()
    check("cuGraphDestroy", drv.cuGraphDestroy(drv.CUgraph(graph)))


def set_kernel_node_function(node: int, func: int) -> None:
    """Swap the function a kernel node launches, keeping grid, block and parameters."""
    drv = require_driver()
    handle = drv.CUgraphNode(node)
    params = check("cuGraphKernelNodeGetParams", drv.cuGraphKernelNodeGetParams(handle))
    params.func = drv.CUfunction(func)
    if hasattr(params, "kern"):
        params.kern = drv.CUkernel(0)
    check("cuGraphKernelNodeSetParams", drv.cuGraphKernelNodeSetParams(handle, params))


# --- host-side updates of an instantiated graph's kernel node --------------------------------------
# cuda-bindings spells the call ``cuGraphExecKernelNodeSetParams`` in every release (from CUDA 12 it
# binds ``cuGraphExecKernelNodeSetParams_v2``, whose ``CUDA_KERNEL_NODE_PARAMS`` gained ``kern`` and
# ``ctx`` after ``extra``); CUDA 13 announces its deprecation in favour of ``cuGraphExecNodeSetParams``.
# ``CUDA_KERNEL_NODE_PARAMS.kernelParams`` accepts the address of a ``void*[]`` array as an int in every
# release (the bindings' kernel parameter helper passes an int through as the array pointer).


@functools.cache
def has_exec_kernel_node_set_params() -> bool:
    """The bindings can set a kernel node's parameters in an executable graph from the host."""
    drv = driver()
    return drv is not None and hasattr(drv, "cuGraphExecKernelNodeSetParams")


def kernel_node_params_reading(node: int, kernel_params: int) -> Any:
    """``node``'s ``CUDA_KERNEL_NODE_PARAMS`` (function, grid, block, shared memory as the node has them)
    with its arguments read from the ``void*[]`` array at ``kernel_params`` (``extra`` cleared).

    The caller keeps the array, and the argument buffers it points to, alive as long as the object is
    used: the driver reads them at each call that is given the object.
    """
    drv = require_driver()
    params = check("cuGraphKernelNodeGetParams", drv.cuGraphKernelNodeGetParams(drv.CUgraphNode(node)))
    return with_kernel_params(params, kernel_params)


def with_kernel_params(params: Any, kernel_params: int) -> Any:
    """``params`` (a ``CUDA_KERNEL_NODE_PARAMS``) passing the arguments of the ``void*[]`` array at
    ``kernel_params`` and no ``extra``."""
    params.kernelParams = int(kernel_params)
    params.extra = 0
    return params


def kernel_node_params_with_arguments(node: int, kernel_params: int, extra: int) -> Any:
    """``node``'s ``CUDA_KERNEL_NODE_PARAMS`` passing the arguments of the ``void*[]`` array at
    ``kernel_params``, or (``kernel_params`` 0) of the ``extra`` array at ``extra``; the caller keeps both
    alive while the object is used."""
    drv = require_driver()
    params = check("cuGraphKernelNodeGetParams", drv.cuGraphKernelNodeGetParams(drv.CUgraphNode(node)))
    params.kernelParams = int(kernel_params)
    params.extra = int(extra) if not kernel_params else 0
    return params


def exec_kernel_node_setter(graph_exec: int, node: int, params: Any) -> Callable[[], None]:
    """A function that sends ``params`` (from ``kernel_node_params_reading``) to ``node`` of
    ``graph_exec`` (``cuGraphExecKernelNodeSetParams``); it raises ``CudaDriverError`` on failure.

    The handles and the bound call are made here, once: a call costs one bindings call and one
    comparison. CUDA documents that the update affects later launches of ``graph_exec`` only, never
    launches already queued or running.
    """
    drv = require_driver()
    if not has_exec_kernel_node_set_params():
        raise CudaDriverError("these cuda-bindings have no cuGraphExecKernelNodeSetParams")
    call = drv.cuGraphExecKernelNodeSetParams
    exec_handle = drv.CUgraphExec(graph_exec)
    node_handle = drv.CUgraphNode(node)
    success = drv.CUresult.CUDA_SUCCESS

    def set_params() -> None:
        result = call(exec_handle, node_handle, params)
        if result[0] != success:
            check("cuGraphExecKernelNodeSetParams", result)

    return set_params


def clear_last_error() -> None:
    """Reset the runtime's last error after a failed capture, so later launch checks do not see it."""
    try:
        runtime = importlib.import_module("cuda.bindings.runtime")
    except Exception:
        try:
            runtime = importlib.import_module("cuda.cudart")
        except Exception:
            return
    try:
        runtime.cudaGetLastError()
    except Exception:
        return


_DEVICE_UPDATABLE = "DEVICE_UPDATABLE_KERNEL_NODE"


@functools.cache
def device_updatable_attribute() -> tuple[Any, Any]:
    """The device-updatable attribute id and the node attribute value type, across bindings releases.

    ``cuGraphKernelNodeSetAttribute`` type-checks its value (``CUkernelNodeAttrValue``, which is not the
    launch attribute value class in every release: docs/design/pi.md) but takes the id by value, so the
    id may come from ``CUkernelNodeAttrID`` or ``CUlaunchAttributeID``. Raises
    ``RuntimeError`` where the bindings have neither (CUDA < 12.4).
    """
    drv = require_driver()
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


def graph_add_dependencies(graph: int, before: int, after: Sequence[int]) -> None:
    """Edges ``before -> a`` for every ``a`` in ``after`` (the 4- and 5-argument forms of the call)."""
    drv = require_driver()
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
