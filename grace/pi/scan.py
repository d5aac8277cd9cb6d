"""Find every place a captured graph uses a dynamic input's address.

Problem: parameter indirection may only serve an input from the pointer table when every use of that
input in the graph reads through the table. Uses hide in kernel parameters (a pointer argument, or an
address inside a struct passed by value, e.g. cuBLAS's argument block with its TMA descriptors) and in
memcpy and memset nodes, which cannot be redirected. A use that is not found is a wrong result.

Design: a use is an 8-byte little-endian value inside a placeholder's storage range. Each kernel node's
parameters (or its ``extra`` argument buffer) are scanned: an 8-byte parameter that matches is a
``PARAM`` use; a match inside a larger parameter, or inside an ``extra`` buffer without a known layout,
is a ``RAW`` use (found at every 4-byte step). Memcpy and memset nodes that touch a placeholder are
``COPY`` uses. A node whose parameters cannot be read, or of a type that could hide a use (host nodes,
child graphs, conditional nodes), makes every input unaccountable. Pure logic over plain data, so it is
tested without a GPU.

Invariant: ``scan`` never drops a match: an input with any use it cannot classify is reported in
``unaccountable``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

POINTER_SIZE = 8
RAW_STEP = 4
# Node types that cannot read a dynamic input behind PI's back.
HARMLESS_NODE_TYPES = frozenset({"empty", "event_record", "wait_event", "mem_alloc", "mem_free"})


class UseKind(str, enum.Enum):
    PARAM = "param"  # an 8-byte kernel parameter holds the address
    RAW = "raw"  # the address sits inside a larger parameter or an `extra` buffer
    COPY = "copy"  # a memcpy or memset node reads or writes the input


@dataclass(frozen=True)
class InputRange:
    """A dynamic input's placeholder: its data pointer and the storage range it may be addressed in."""

    index: int
    data_ptr: int
    start: int
    end: int

    def contains(self, value: int) -> bool:
        return self.start <= value < self.end


@dataclass(frozen=True)
class Use:
    """One appearance of input ``index`` in node ``node``."""

    index: int
    node: int
    kind: UseKind
    delta: int  # the value minus the placeholder's data pointer (a view's offset in bytes)
    param_index: int | None = None  # the kernel parameter holding it (PARAM, and RAW inside a parameter)
    byte_offset: int = 0  # its offset in the kernel's parameter buffer (device-side layout)


class ParamLike(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def raw(self) -> bytes: ...


class KernelNodeLike(Protocol):
    """What the scan reads of a kernel node (``grace.cudagraph.KernelNode`` has it)."""

    @property
    def node(self) -> int: ...
    @property
    def function(self) -> int: ...
    @property
    def params(self) -> Sequence[ParamLike]: ...
    @property
    def extra(self) -> bytes | None: ...


@dataclass(frozen=True)
class CopyNode:
    """A memcpy or memset node: the device byte ranges it touches."""

    node: int
    ranges: tuple[tuple[int, int], ...]


@dataclass
class ScanResult:
    uses: list[Use] = field(default_factory=list)
    unaccountable: dict[int, str] = field(default_factory=dict)  # input index -> why
    everything_unaccountable: str | None = None  # set when the whole graph cannot be accounted for

    def uses_of(self, index: int) -> list[Use]:
        return [u for u in self.uses if u.index == index]


def find(value: int, ranges: Sequence[InputRange]) -> InputRange | None:
    for r in ranges:
        if r.contains(value):
            return r
    return None


def _scan_bytes(data: bytes, ranges: Sequence[InputRange]) -> list[tuple[int, InputRange, int]]:
    """(offset, input, value) of every in-range 8-byte value at a ``RAW_STEP`` boundary."""
    hits = []
    for offset in range(0, len(data) - POINTER_SIZE + 1, RAW_STEP):
        value = int.from_bytes(data[offset : offset + POINTER_SIZE], "little")
        hit = find(value, ranges)
        if hit is not None:
            hits.append((offset, hit, value))
    return hits


def scan_kernel_node(node: KernelNodeLike, ranges: Sequence[InputRange]) -> list[Use] | None:
    """Uses in one kernel node; None when its parameters could not be read."""
    uses: list[Use] = []
    if node.params:
        for p in node.params:
            if len(p.raw) != p.size:
                return None
            if p.size == POINTER_SIZE:
                value = int.from_bytes(p.raw, "little")
                hit = find(value, ranges)
                if hit is not None:
                    uses.append(
                        Use(hit.index, node.node, UseKind.PARAM, value - hit.data_ptr, p.index, p.offset)
                    )
            elif p.size > POINTER_SIZE:
                for offset, hit, value in _scan_bytes(p.raw, ranges):
                    uses.append(
                        Use(
                            hit.index,
                            node.node,
                            UseKind.RAW,
                            value - hit.data_ptr,
                            p.index,
                            p.offset + offset,
                        )
                    )
        return uses
    if node.extra is not None:
        for offset, hit, value in _scan_bytes(node.extra, ranges):
            uses.append(Use(hit.index, node.node, UseKind.RAW, value - hit.data_ptr, None, offset))
        return uses
    return None


def scan(
    kernel_nodes: Iterable[KernelNodeLike],
    copy_nodes: Iterable[CopyNode],
    other_node_types: Mapping[int, str],
    ranges: Sequence[InputRange],
    parameterless: Iterable[int] = (),
) -> ScanResult:
    """Every use of every input in ``ranges``.

    ``other_node_types`` maps the remaining nodes to their type; ``parameterless`` names kernel nodes
    whose function takes no parameters (they read no input through their arguments).
    """
    result = ScanResult()
    unknown = sorted({t for t in other_node_types.values() if t not in HARMLESS_NODE_TYPES})
    if unknown:
        result.everything_unaccountable = f"graph has node types that may use inputs: {', '.join(unknown)}"
        return result
    empty = set(parameterless)
    for node in kernel_nodes:
        uses = scan_kernel_node(node, ranges)
        if uses is None:
            if node.node in empty:
                continue
            result.everything_unaccountable = f"parameters of kernel node {node.node:#x} could not be read"
            return result
        result.uses.extend(uses)
    for copy in copy_nodes:
        for start, end in copy.ranges:
            for r in ranges:
                if start < r.end and r.start < end:
                    result.uses.append(Use(r.index, copy.node, UseKind.COPY, start - r.data_ptr))
                    result.unaccountable.setdefault(r.index, f"memcpy/memset node {copy.node:#x} touches it")
    return result
