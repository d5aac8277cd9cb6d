"""Where a graph uses its inputs (grace.pi.scan), on hand-built nodes: no GPU needed."""

from __future__ import annotations

from dataclasses import dataclass

from grace.pi import scan
from grace.pi.scan import CopyNode, InputRange, UseKind

A = InputRange(index=0, data_ptr=0x7F00_0000_1000, start=0x7F00_0000_1000, end=0x7F00_0000_2000)
B = InputRange(index=3, data_ptr=0x7F00_0001_0000, start=0x7F00_0001_0000, end=0x7F00_0001_0400)


def p64(value: int) -> bytes:
    return value.to_bytes(8, "little")


@dataclass(frozen=True)
class Param:
    index: int
    offset: int
    size: int
    raw: bytes


@dataclass(frozen=True)
class Node:
    node: int
    function: int
    params: tuple[Param, ...]
    extra: bytes | None = None


def kernel(node: int, *values: bytes) -> Node:
    params, offset = [], 0
    for i, raw in enumerate(values):
        params.append(Param(i, offset, len(raw), raw))
        offset += len(raw)
    return Node(node, 0xF, tuple(params))


def test_pointer_params_and_view_offsets() -> None:
    node = kernel(1, p64(A.data_ptr + 64), p64(0x1234), (7).to_bytes(4, "little"), p64(B.data_ptr))
    result = scan.scan([node], [], {}, [A, B])
    assert result.everything_unaccountable is None and not result.unaccountable
    assert [(u.index, u.kind, u.delta, u.param_index, u.byte_offset) for u in result.uses] == [
        (0, UseKind.PARAM, 64, 0, 0),
        (3, UseKind.PARAM, 0, 3, 20),
    ]


def test_end_of_range_is_not_a_use() -> None:
    result = scan.scan([kernel(1, p64(A.end), p64(A.start - 1))], [], {}, [A])
    assert result.uses == []


def test_struct_parameter_and_extra_buffer_give_raw_uses() -> None:
    blob = bytes(12) + p64(B.data_ptr + 8) + bytes(4) + p64(A.data_ptr) + bytes(8)
    in_struct = kernel(2, p64(0), blob)
    raw = [u for u in scan.scan([in_struct], [], {}, [A, B]).uses]
    assert [(u.index, u.kind, u.delta, u.param_index, u.byte_offset) for u in raw] == [
        (3, UseKind.RAW, 8, 1, 8 + 12),
        (0, UseKind.RAW, 0, 1, 8 + 24),
    ]
    extra = Node(3, 0xE, (), extra=blob)
    assert [(u.index, u.byte_offset, u.param_index) for u in scan.scan([extra], [], {}, [A, B]).uses] == [
        (3, 12, None),
        (0, 24, None),
    ]


def test_copy_nodes_make_their_inputs_unaccountable() -> None:
    copy = CopyNode(9, ((A.start + 16, A.start + 32),))
    unrelated = CopyNode(10, ((0x10, 0x20),))
    result = scan.scan([kernel(1, p64(A.data_ptr), p64(B.data_ptr))], [copy, unrelated], {}, [A, B])
    assert set(result.unaccountable) == {0}
    assert {u.kind for u in result.uses_of(0)} == {UseKind.PARAM, UseKind.COPY}
    assert [u.kind for u in result.uses_of(3)] == [UseKind.PARAM]


def test_unknown_node_types_and_unreadable_params_stop_everything() -> None:
    result = scan.scan([kernel(1, p64(A.data_ptr))], [], {5: "host", 6: "empty"}, [A])
    assert result.everything_unaccountable is not None and "host" in result.everything_unaccountable
    unreadable = Node(4, 0xF, ())
    assert scan.scan([unreadable], [], {}, [A]).everything_unaccountable is not None
    assert scan.scan([unreadable], [], {}, [A], parameterless=[4]).everything_unaccountable is None
    truncated = Node(5, 0xF, (Param(0, 0, 8, b"\x00" * 4),))
    assert scan.scan([truncated], [], {}, [A]).everything_unaccountable is not None


def test_harmless_node_types_are_fine() -> None:
    types = {n: t for n, t in enumerate(sorted(scan.HARMLESS_NODE_TYPES))}
    assert scan.scan([kernel(1, p64(A.data_ptr))], [], types, [A]).everything_unaccountable is None
