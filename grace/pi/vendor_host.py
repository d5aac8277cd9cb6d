"""Vendor kernel nodes updated from the host: option ``pi_vendor_update="host"`` (the default).

Problem: a vendor kernel (cuBLAS) reads input addresses inside its argument bytes (grace.pi.vendor). The
device path marks such nodes device-updatable and adds a prelude that rewrites them on every replay.
On the H200 (CUDA 13, torch 2.11) a training backward with 118 such nodes never finished a replay under
``torch.profiler`` with CUDA activities (docs/design/training.md), while the same graph without PI did:
a graph that may hang its process under a profiler is not safe to hand out by default.

Design: each vendor node keeps a private copy of its arguments, in the form it was captured with (one
buffer per parameter for ``kernelParams``, one argument buffer for ``extra``), and a
``CUDA_KERNEL_NODE_PARAMS`` pointing at that copy. ``HostVendorTable`` wraps the table writer the plan
already has (grace.pi.table or grace.pi.fill): a write that changes the table's values also writes each
vendor node's slots into its copy and, for a node whose bytes changed, calls
``cuGraphExecKernelNodeSetParams`` on the executable graph. CUDA documents that such an update applies
to later launches only, so the replay that follows reads the new addresses and one in flight keeps the
old ones. The graph has no device-updatable node and no prelude kernel; a call whose addresses did not
change costs nothing here (the wrapped writer's own comparison says so).

Invariants:
- after a write, every vendor node of the executable graph holds, at each patched offset, the value
  the table holds for that slot (or a driver error was raised, and the caller falls back);
- a node is sent only when its bytes changed, and only after ``prepare_launch`` bound the executable
  graph; a write before that is sent by ``prepare_launch`` itself.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grace.cudagraph import extra_arguments

POINTER = struct.Struct("<Q")


@dataclass(frozen=True)
class HostPatch:
    """One 8-byte address in a vendor node's arguments: in parameter ``param_index`` (None: the ``extra``
    buffer) at ``byte_offset`` of the device-side layout, which that parameter starts at
    ``param_offset``; it takes table slot ``slot``."""

    param_index: int | None
    param_offset: int
    byte_offset: int
    slot: int


class NodeArguments:
    """A private copy of one kernel node's arguments and the update that sends it to the executable
    graph. ``params`` are the node's parameter bytes (``kernelParams`` form) or None with ``extra``."""

    def __init__(
        self, node: int, params: Sequence[bytes] | None, extra: bytes | None, patches: Sequence[HostPatch]
    ) -> None:
        self.node = node
        self.slots = tuple(p.slot for p in patches)
        self._keep: list[Any] = []
        self._sites: list[int] = []
        if params is not None:
            buffers = [ctypes.create_string_buffer(v, max(len(v), 1)) for v in params]
            array = (ctypes.c_void_p * max(len(buffers), 1))(*[ctypes.addressof(b) for b in buffers])
            self._keep += [buffers, array]
            self.kernel_params, self.extra = ctypes.addressof(array), 0
            for p in patches:
                if p.param_index is None or not 0 <= p.param_index < len(buffers):
                    raise ValueError(f"node {node:#x}: a patch names no parameter of the node")
                inner = p.byte_offset - p.param_offset
                if inner < 0 or inner + POINTER.size > len(params[p.param_index]):
                    raise ValueError(f"node {node:#x}: a patch lies outside parameter {p.param_index}")
                self._sites.append(ctypes.addressof(buffers[p.param_index]) + inner)
        elif extra is not None:
            self.extra, keep = extra_arguments(extra)
            self.kernel_params = 0
            self._keep += keep
            base = ctypes.addressof(keep[0])  # the buffer's copy
            for p in patches:
                if p.byte_offset < 0 or p.byte_offset + POINTER.size > len(extra):
                    raise ValueError(
                        f"node {node:#x}: a patch lies outside its {len(extra)}-byte argument buffer"
                    )
                self._sites.append(base + p.byte_offset)
        else:
            raise ValueError(f"node {node:#x}: neither parameters nor an argument buffer")
        self._last: tuple[int, ...] = tuple(self._read(site) for site in self._sites)
        self._send: Callable[[], None] | None = None

    @staticmethod
    def _read(site: int) -> int:
        return int(POINTER.unpack(ctypes.string_at(site, POINTER.size))[0])

    def bind(self, send: Callable[[], None]) -> None:
        """The function that sends this copy to the node of the executable graph."""
        self._send = send

    def values(self) -> tuple[int, ...]:
        """The addresses the copy holds, one per patch."""
        return self._last

    def apply(self, table_values: Sequence[int]) -> bool:
        """Write this node's slots of ``table_values`` into the copy; send it if its bytes changed."""
        current = tuple(table_values[s] for s in self.slots)
        if current == self._last:
            return False
        if self._send is None:
            raise RuntimeError("the vendor node's executable graph is unknown: prepare_launch must run first")
        for site, value in zip(self._sites, current, strict=True):
            ctypes.memmove(site, POINTER.pack(value), POINTER.size)
        self._send()
        self._last = current
        return True


class HostVendorTable:
    """A table writer (grace.pi.table, grace.pi.fill) whose writes also reach the vendor nodes."""

    def __init__(self, inner: Any, nodes: Sequence[NodeArguments]) -> None:
        self.inner = inner
        self.nodes = tuple(nodes)
        self.slots = inner.slots
        self.sends = 0  # node updates sent to the executable graph
        self._bound = False  # prepare_launch has bound every node to the executable graph
        self._pending: Sequence[int] | None = None  # values written before prepare_launch

    @property
    def bytes_per_copy(self) -> int:
        return int(self.inner.bytes_per_copy)

    def address(self, slot: int) -> int:
        return int(self.inner.address(slot))

    def prepare_launch(self, graph_exec: int | None, stream: int) -> None:
        """Bind the inner writer and every vendor node to the executable graph (raises when it cannot)."""
        from grace.compat import cuda as cuda_compat

        prepare = getattr(self.inner, "prepare_launch", None)
        if callable(prepare):
            prepare(graph_exec, stream)
        if graph_exec is None:
            raise RuntimeError("vendor nodes are updated in the executable graph, but there is no handle")
        for n in self.nodes:
            params = cuda_compat.kernel_node_params_with_arguments(n.node, n.kernel_params, n.extra)
            n.bind(cuda_compat.exec_kernel_node_setter(graph_exec, n.node, params))
        self._bound = True
        pending, self._pending = self._pending, None
        if pending is not None:
            self._apply(pending)

    def write(self, values: Sequence[int]) -> bool:
        changed = bool(self.inner.write(values))
        if changed and self._bound:
            self._apply(values)
        elif changed:
            self._pending = tuple(values)
        return changed

    def _apply(self, values: Sequence[int]) -> None:
        for n in self.nodes:
            self.sends += n.apply(values)
