"""The pointer table written by a kernel node of the graph itself, updated with the graph's launch.

Problem: the copy path (grace.pi.table) writes the table before each replay with its own host-to-device
copy: a torch ``copy_`` dispatch and an event record on the host, and on the GPU a small copy on the
copy engine that the graph launch waits for, idling the GPU before the graph's first kernel (the
measurements are in docs/design/pi.md).

Design: a tiny kernel, ``grace_pi_fill(table, values)``, takes the slot values by value (a struct of
``bucket`` 64-bit values, one kernel parameter) and writes them into the table, one thread per slot.
``serve`` adds it to the captured graph as a root node with an edge to every other root (so it runs
before every node, the vendor prelude included, which reads the table). After instantiation
``FillTable.prepare_launch`` binds ``cuGraphExecKernelNodeSetParams`` on the executable graph
(``grace.compat.cuda.exec_kernel_node_setter``); a write then packs the values into the node's
argument buffer and makes that one driver call. CUDA documents that the update affects later launches
only, never launches already queued, so no staging ring and no event are needed. Variants are compiled
with NVRTC (grace.pi.nvrtc) per (bucket, capability, device): buckets are powers of two from 8, and the
last one fills what remains of the 4096-byte kernel parameter block.

Invariants:
- The graph is instantiated with the node's values equal to the placeholders' addresses (what the copy
  path's table holds when nothing moved); every write replaces them all.
- A ``FillTable`` writes nothing before ``prepare_launch`` succeeded, and a failed ``prepare_launch``
  raises: a graph whose fill node cannot be updated would make every replay read stale addresses, so
  the caller must drop PI for that graph, never run it.
- Every reason the node cannot serve the table before instantiation (mode ``copy``, no executable
  graph handle on this torch, too many slots, NVRTC missing, compile/load/add-node failures) leaves the
  graph without a fill node, the copy table serving it, and a ``table`` stage entry saying why. A node
  that was added and cannot be removed again raises ``FillUnsafe``: PI must be declined.
- ``bytes_per_copy`` is ``8 * slots``, the bytes of the parameter update, as for the copy table.
"""

from __future__ import annotations

import functools
import logging
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grace.pi.table import SLOT_BYTES, CountsWrites, LastValues, PointerTable
from grace.pi_contract import PIStage, StageSink, StageStatus

if TYPE_CHECKING:
    from grace.pi.driver import ParamBuffer

logger = logging.getLogger(__name__)

FILL_NAME = "grace_pi_fill"
# GRACE_PI_SLOTS is the bucket, defined per variant on the NVRTC command line. The node's block has one
# thread per slot in use (at most the bucket), so every thread writes one slot the table has.
FILL_SOURCE = r"""
struct grace_pi_values { unsigned long long slot[GRACE_PI_SLOTS]; };

extern "C" __global__ void grace_pi_fill(unsigned long long* table, grace_pi_values values)
{
    unsigned int i = threadIdx.x;
    if (i < GRACE_PI_SLOTS) table[i] = values.slot[i];
}
"""
PARAM_BLOCK_BYTES = 4096  # the kernel parameter block every CUDA release accepts
TABLE_PARAM_BYTES = 8  # the table pointer, before the values
MAX_FILL_SLOTS = (PARAM_BLOCK_BYTES - TABLE_PARAM_BYTES) // SLOT_BYTES  # 511
SMALLEST_BUCKET = 8

TABLE_UPDATE_COPY = "copy"
TABLE_UPDATE_NODE = "node"


class FillUnavailable(RuntimeError):
    """The fill node cannot serve this table; ``status`` is the stage status (skip or fail)."""

    def __init__(self, status: StageStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class FillUnsafe(RuntimeError):
    """A fill node is in the graph and could not be taken out again: the graph must not use PI."""


def bucket(slots: int) -> int | None:
    """The slot count of the kernel variant serving ``slots`` slots; None past ``MAX_FILL_SLOTS``."""
    if slots < 1:
        raise ValueError(f"a fill node serves at least one slot, not {slots}")
    if slots > MAX_FILL_SLOTS:
        return None
    size = SMALLEST_BUCKET
    while size < slots:
        size *= 2
    return min(size, MAX_FILL_SLOTS)


@dataclass(frozen=True)
class FillLayout:
    """The kernel parameters of a fill node: the table pointer, then ``bucket`` 64-bit values."""

    slots: int
    bucket: int

    @classmethod
    def for_slots(cls, slots: int) -> FillLayout:
        size = bucket(slots)
        if size is None:
            raise FillUnavailable(
                StageStatus.SKIP,
                f"{slots} slots exceed the fill kernel's parameter block ({MAX_FILL_SLOTS} slots fit in "
                f"{PARAM_BLOCK_BYTES} bytes)",
            )
        return cls(slots, size)

    @property
    def param_block_bytes(self) -> int:
        return TABLE_PARAM_BYTES + SLOT_BYTES * self.bucket

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.slots, 1, 1)

    def table_param(self, table_address: int) -> bytes:
        return struct.pack("<Q", table_address)

    def values_param(self, values: Sequence[int]) -> bytes:
        """The values parameter: ``values`` little-endian, zeros up to the bucket."""
        if len(values) != self.slots:
            raise ValueError(f"{len(values)} values for {self.slots} slots")
        return struct.pack(f"<{self.slots}Q", *values).ljust(SLOT_BYTES * self.bucket, b"\0")


@functools.cache
def compile_fill(bucket_slots: int, capability: int) -> bytes:
    """PTX of the fill kernel for ``bucket_slots`` values and ``compute_<capability>``."""
    from grace.pi import nvrtc

    return nvrtc.compile_ptx(
        FILL_SOURCE, "grace_pi_fill.cu", capability, [f"-DGRACE_PI_SLOTS={bucket_slots}"]
    )


_fill_functions: dict[tuple[int, int, int], int] = {}  # (device index, capability, bucket) -> CUfunction


def fill_function(layout: FillLayout, capability: int, device_index: int) -> int:
    """The loaded fill ``CUfunction`` of ``layout``'s bucket, once per process, device and capability
    (loaded into the current context, which must be device ``device_index``'s)."""
    from grace.pi import nvrtc

    key = (device_index, capability, layout.bucket)
    if key not in _fill_functions:
        _fill_functions[key] = nvrtc.load_ptx(compile_fill(layout.bucket, capability), FILL_NAME)
    return _fill_functions[key]


class FillTable(CountsWrites):
    """The device table of a ``PointerTable``, written by the graph's fill node (the table's interface).

    Invariant: after ``write`` returned, the next launch of the graph (not one already queued) writes
    ``values`` into the table before any other node runs.
    """

    def __init__(
        self,
        table: PointerTable,
        node: int,
        layout: FillLayout,
        params: ParamBuffer,
        node_params: Any,
        ahead_of: int,
    ) -> None:
        self.slots = table.slots
        self.node = node
        self.layout = layout
        self.ahead_of = ahead_of  # root nodes the fill node was ordered before
        self._table = table
        self._params = params  # the argument array node_params points at (kept alive here)
        self._node_params = node_params
        self._values = params.value(1)
        self._format = struct.Struct(f"<{self.slots}Q")
        self._last = LastValues(self.slots, self._format.unpack_from(self._values, 0))
        self._set_params: Callable[[], None] | None = None

    @property
    def bytes_per_copy(self) -> int:
        return SLOT_BYTES * self.slots

    def address(self, slot: int) -> int:
        return self._table.address(slot)

    def prepare_launch(self, graph_exec: int | None, stream: int) -> None:
        """Bind the node's parameter update to the executable graph and send the current values once.

        Raises when it cannot: the graph's fill node would then write stale addresses forever.
        """
        from grace.compat import cuda as cuda_compat

        if graph_exec is None:
            raise RuntimeError("the pointer table is filled by a graph node but no executable graph handle")
        setter = cuda_compat.exec_kernel_node_setter(graph_exec, self.node, self._node_params)
        setter()
        self._set_params = setter

    def write(self, values: Sequence[int]) -> bool:
        """Make the next launch fill the table with ``values``; True when the node's values changed."""
        current = self._last.changed(values)
        if current is None:
            return False
        set_params = self._set_params
        if set_params is None:
            raise RuntimeError("the fill node's executable graph is unknown: prepare_launch must run first")
        self._format.pack_into(self._values, 0, *current)
        set_params()
        self._last.commit(current)
        return True


def _add_node(
    graph: int, table: PointerTable, initial: Sequence[int], capability: int, device_index: int
) -> FillTable:
    """Add the fill node ahead of every root of ``graph``; raise ``FillUnavailable`` (nothing added) or
    ``FillUnsafe`` (a node stays in the graph)."""
    from grace.compat import cuda as cuda_compat
    from grace.pi import driver, nvrtc

    layout = FillLayout.for_slots(table.slots)
    try:
        nvrtc.bindings()
    except nvrtc.NvrtcError as exc:
        raise FillUnavailable(StageStatus.SKIP, str(exc)) from exc
    try:
        function = fill_function(layout, capability, device_index)
    except Exception as exc:
        raise FillUnavailable(
            StageStatus.FAIL, f"building the fill kernel: {type(exc).__name__}: {exc}"
        ) from exc
    params = driver.ParamBuffer([layout.table_param(table.address(0)), layout.values_param(initial)])
    try:
        roots = cuda_compat.graph_root_nodes(graph)
        node = driver.add_kernel_node(graph, function, (1, 1, 1), layout.block, params)
    except Exception as exc:
        raise FillUnavailable(StageStatus.FAIL, f"adding the fill node: {type(exc).__name__}: {exc}") from exc
    try:
        cuda_compat.graph_add_dependencies(graph, node, roots)
        node_params = cuda_compat.kernel_node_params_reading(node, params.address)
    except Exception as exc:
        why = f"ordering the fill node before the graph's roots: {type(exc).__name__}: {exc}"
        try:
            driver.remove_node(node)
        except Exception as again:
            raise FillUnsafe(f"{why}; removing it again: {type(again).__name__}: {again}") from again
        raise FillUnavailable(StageStatus.FAIL, why) from exc
    return FillTable(table, node, layout, params, node_params, len(roots))


def serve(
    graph: int,
    table: PointerTable,
    initial: Sequence[int],
    mode: str,
    *,
    capturing: bool,
    capability: int,
    device_index: int,
    stages: StageSink,
) -> PointerTable | FillTable:
    """What writes ``table`` per replay under option ``pi_table_update`` = ``mode``: a ``FillTable``
    over a fill node added to ``graph`` (values ``initial`` until the first write), or ``table`` itself
    (the copy path). Records one ``table`` stage entry saying which and why."""
    from grace.compat import cuda as cuda_compat
    from grace.compat import torch as torch_compat

    copy_note = f"{table.slots} slots written by one host-to-device copy of {table.bytes_per_copy} bytes"
    if mode == TABLE_UPDATE_COPY:
        stages.add(PIStage.TABLE, StageStatus.PASS, f"copy: {copy_note} per replay (pi_table_update='copy')")
        return table
    if mode != TABLE_UPDATE_NODE:
        raise ValueError(
            f"pi_table_update must be {TABLE_UPDATE_COPY!r} or {TABLE_UPDATE_NODE!r}, not {mode!r}"
        )
    try:
        if capturing:
            raise FillUnavailable(
                StageStatus.SKIP, "the graph is still being captured (torch without keep_graph)"
            )
        if not torch_compat.has_raw_cuda_graph_exec():
            raise FillUnavailable(
                StageStatus.SKIP, "this torch gives no executable graph handle (raw_cuda_graph_exec)"
            )
        if not cuda_compat.has_exec_kernel_node_set_params():
            raise FillUnavailable(
                StageStatus.SKIP, "these cuda-bindings have no cuGraphExecKernelNodeSetParams"
            )
        served = _add_node(graph, table, initial, capability, device_index)
    except FillUnavailable as exc:
        stages.add(PIStage.TABLE, exc.status, f"copy: {exc} (pi_table_update='node'); {copy_note} per replay")
        logger.info("grace PI: the pointer table falls back to copies: %s", exc)
        return table
    stages.add(
        PIStage.TABLE,
        StageStatus.PASS,
        f"node: a fill kernel node ({served.layout.bucket}-slot variant) ahead of the graph's "
        f"{served.ahead_of} root nodes writes {table.slots} slots; one parameter update of "
        f"{served.bytes_per_copy} bytes per replay",
    )
    return served
