"""The vendor path of parameter indirection: kernels grace cannot rewrite (cuBLAS) updated on the device.

Problem: a cuBLAS kernel node cannot be recompiled; its argument block (launched through ``extra``)
holds the input addresses, several times, also inside TMA descriptors (DESIGN.md 3.4). A replay that
must read moved inputs needs those bytes changed before the kernel runs.

Design: the scan (grace.pi.scan) found every 8-byte match of an input in the node's parameter bytes.
Each such node is marked device-updatable, which yields a device-side node handle. One prelude kernel,
compiled with NVRTC as relocatable device code and loaded with ``cuModuleLoadData`` (grace.pi.nvrtc; the
driver resolves its call into the device runtime), is added to the graph as a root with an edge to every
patched node (the table's fill node, when grace.pi.fill serves the table, is added later and runs first).
On every replay it reads the current slot values from the pointer table and applies them with
``cudaGraphKernelNodeUpdatesApply``: the patched kernels see the new addresses in the same launch.

Invariants:
- A node is patched only at offsets where the scan found an input; every use of an input must be
  patched for the input to be served by PI (grace.pi.plan enforces it).
- The numerics of the patched kernels must be checked against eager (TMA descriptor layout is not
  documented); the runner does, after the inputs move.
- A graph with device-updatable nodes is instantiated once and never updated with
  ``cudaGraphExecUpdate``; CUDA documents ``cuGraphUpload`` before such a launch: the runner hands the
  executable graph to ``PiPlan.prepare_launch``, which uploads it, and reads every prelude's status
  (``PiPlan.health``) at each numeric check.
"""

from __future__ import annotations

import ctypes
import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grace.pi_contract import PIStage

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

PRELUDE_NAME = "grace_pi_prelude"
# NVRTC declares the device runtime (cudaGraphKernelNodeUpdate, cudaGraphKernelNodeUpdatesApply, CUDA
# 12.4+); the update struct is 40 bytes: node at 0, field at 8, {pValue, offset, size} at 16.
PRELUDE_SOURCE = r"""
struct grace_update_spec { unsigned long long node; unsigned long long offset; unsigned long long slot; };

extern "C" __global__ void grace_pi_prelude(
    const grace_update_spec* specs, unsigned int count, const unsigned long long* table,
    cudaGraphKernelNodeUpdate* scratch, int* status)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    for (unsigned int i = 0; i < count; ++i) {
        scratch[i].node = (cudaGraphDeviceNode_t)specs[i].node;
        scratch[i].field = cudaGraphKernelNodeFieldParam;
        scratch[i].updateData.param.pValue = &table[specs[i].slot];
        scratch[i].updateData.param.offset = specs[i].offset;
        scratch[i].updateData.param.size = 8;
    }
    *status = (int)cudaGraphKernelNodeUpdatesApply(scratch, count);
}
"""
UPDATE_STRUCT_SIZE = 40
SPEC_STRUCT = struct.Struct("<QQQ")


class VendorError(RuntimeError):
    """The vendor path could not be set up; ``stage`` is vendor_match or vendor_update."""

    def __init__(self, stage: PIStage, message: str) -> None:
        super().__init__(message)
        self.stage = stage


def compile_prelude(capability: int) -> bytes:
    """PTX of the prelude, relocatable device code for ``compute_<capability>``."""
    from grace.pi import nvrtc

    try:
        return nvrtc.compile_ptx(PRELUDE_SOURCE, "grace_pi_prelude.cu", capability, ["-rdc=true"])
    except nvrtc.NvrtcError as exc:
        raise VendorError(PIStage.VENDOR_UPDATE, str(exc)) from exc


_prelude_functions: dict[tuple[int, int], int] = {}  # (device index, capability) -> CUfunction


def prelude_function(capability: int, device_index: int = 0) -> int:
    """The loaded prelude ``CUfunction``, compiled and loaded once per process, device and capability
    (into the current context, which must be device ``device_index``'s)."""
    from grace.pi import nvrtc

    key = (device_index, capability)
    if key not in _prelude_functions:
        ptx = compile_prelude(capability)
        try:
            _prelude_functions[key] = nvrtc.load_ptx(ptx, PRELUDE_NAME)
        except nvrtc.NvrtcError as exc:
            raise VendorError(PIStage.VENDOR_UPDATE, f"the prelude: {exc}") from exc
    return _prelude_functions[key]


@dataclass(frozen=True)
class VendorPatch:
    """Where a vendor node reads an input: its device handle and the byte offset in its parameters."""

    node: int
    offset: int
    slot: int


@dataclass
class VendorSetup:
    """Device memory and the prelude node that serve the patched vendor nodes (kept alive by the plan)."""

    prelude_node: int
    specs: Any  # torch tensor holding the update specs
    scratch: Any  # torch tensor the prelude builds its update array in
    status: Any  # torch tensor receiving cudaGraphKernelNodeUpdatesApply's result
    params: Any  # the ParamBuffer the prelude node was added with
    patches: tuple[VendorPatch, ...]


def install(
    graph: int,
    patches: Sequence[tuple[int, int, int]],
    table_address: int,
    device: torch.device,
    capability: int,
) -> VendorSetup:
    """Mark the nodes of ``patches`` (node, byte offset, slot) device-updatable and add the prelude;
    ``device`` carries its index (the prelude is loaded once per device)."""
    import torch

    from grace.compat import cuda as cuda_compat
    from grace.pi import driver

    if not patches:
        raise VendorError(PIStage.VENDOR_MATCH, "no vendor node to patch")
    function = prelude_function(capability, device.index)
    handles: dict[int, int] = {}
    try:
        for node, _, _ in patches:
            if node not in handles:
                handles[node] = driver.make_device_updatable(node)
    except Exception as exc:
        raise VendorError(
            PIStage.VENDOR_UPDATE, f"device-updatable attribute: {type(exc).__name__}: {exc}"
        ) from exc
    resolved = tuple(VendorPatch(handles[node], offset, slot) for node, offset, slot in patches)
    packed = b"".join(SPEC_STRUCT.pack(p.node, p.offset, p.slot) for p in resolved)
    specs = torch.frombuffer(bytearray(packed), dtype=torch.uint8).to(device)
    scratch = torch.empty(UPDATE_STRUCT_SIZE * len(resolved), dtype=torch.uint8, device=device)
    status = torch.full((1,), -1, dtype=torch.int32, device=device)
    params = driver.ParamBuffer(
        [
            struct.pack("<Q", specs.data_ptr()),
            struct.pack("<I", len(resolved)),
            struct.pack("<Q", table_address),
            struct.pack("<Q", scratch.data_ptr()),
            struct.pack("<Q", status.data_ptr()),
        ]
    )
    try:
        prelude = driver.add_kernel_node(graph, function, (1, 1, 1), (1, 1, 1), params)
        cuda_compat.graph_add_dependencies(graph, prelude, sorted(handles))
    except Exception as exc:
        raise VendorError(
            PIStage.VENDOR_UPDATE, f"adding the prelude node: {type(exc).__name__}: {exc}"
        ) from exc
    return VendorSetup(prelude, specs, scratch, status, params, resolved)


def prelude_status(setup: VendorSetup) -> int:
    """What ``cudaGraphKernelNodeUpdatesApply`` returned in the last replay (0 is success, -1 never ran)."""
    return int(setup.status.item())


def pointer_bytes(value: int) -> bytes:
    return ctypes.c_uint64(value).value.to_bytes(8, "little")
