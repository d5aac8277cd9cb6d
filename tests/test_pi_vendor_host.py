"""grace.pi.vendor_host without a GPU: vendor nodes' argument copies and when an update is sent.

The executable-graph update is a recording stand-in; the copies, the byte positions and the decisions
to send are the real ones.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence

import pytest

from grace.compat import cuda as cuda_compat
from grace.pi.table import LastValues
from grace.pi.vendor_host import HostPatch, HostVendorTable, NodeArguments


class Writer:
    """A table writer that, like grace.pi.table's, says whether the values changed."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.bytes_per_copy = 8 * slots
        self._last = LastValues(slots)

    def address(self, slot: int) -> int:
        return 0xA000 + 8 * slot

    def write(self, values: Sequence[int]) -> bool:
        current = self._last.changed(values)
        if current is None:
            return False
        self._last.commit(current)
        return True


def _extra_buffer(node: NodeArguments) -> bytes:
    """The argument buffer an ``extra`` copy sends: the array's second entry points at it."""
    array = (ctypes.c_void_p * 5).from_address(node.extra)
    size = ctypes.c_size_t.from_address(array[3]).value
    return ctypes.string_at(array[1], size)


def test_a_kernel_params_copy_changes_only_the_patched_bytes() -> None:
    struct_param = b"\x11" * 8 + struct.pack("<Q", 0x1000) + b"\x22" * 8
    node = NodeArguments(7, [struct.pack("<Q", 0x2000), struct_param], None, [HostPatch(1, 8, 16, 0)])
    sent: list[int] = []
    node.bind(lambda: sent.append(1))
    assert node.values() == (0x1000,)
    assert not node.apply([0x1000])  # what the node already holds: nothing sent
    assert node.apply([0x9000]) and sent == [1]
    array = (ctypes.c_void_p * 2).from_address(node.kernel_params)
    assert ctypes.string_at(array[0], 8) == struct.pack("<Q", 0x2000)  # the unpatched parameter
    assert ctypes.string_at(array[1], 24) == b"\x11" * 8 + struct.pack("<Q", 0x9000) + b"\x22" * 8
    assert node.extra == 0


def test_an_extra_copy_is_patched_at_every_offset_of_its_buffer() -> None:
    data = bytearray(64)
    data[8:16] = struct.pack("<Q", 0x1000)
    data[40:48] = struct.pack("<Q", 0x1000 + 256)
    node = NodeArguments(9, None, bytes(data), [HostPatch(None, 0, 8, 0), HostPatch(None, 0, 40, 1)])
    node.bind(lambda: None)
    assert node.apply([0x5000, 0x5100])
    got = _extra_buffer(node)
    assert got[8:16] == struct.pack("<Q", 0x5000) and got[40:48] == struct.pack("<Q", 0x5100)
    assert got[:8] == bytes(8) and node.kernel_params == 0


def test_a_patch_outside_the_arguments_is_refused() -> None:
    with pytest.raises(ValueError, match="outside its 16-byte argument buffer"):
        NodeArguments(1, None, bytes(16), [HostPatch(None, 0, 12, 0)])
    with pytest.raises(ValueError, match="names no parameter"):
        NodeArguments(1, [bytes(8)], None, [HostPatch(None, 0, 0, 0)])
    with pytest.raises(ValueError, match="outside parameter 0"):
        NodeArguments(1, [bytes(8)], None, [HostPatch(0, 0, 4, 0)])


def test_an_unbound_node_refuses_to_change() -> None:
    node = NodeArguments(1, [struct.pack("<Q", 0x1000)], None, [HostPatch(0, 0, 0, 0)])
    with pytest.raises(RuntimeError, match="prepare_launch must run first"):
        node.apply([0x2000])


def _table(monkeypatch: pytest.MonkeyPatch) -> tuple[HostVendorTable, list[int]]:
    sent: list[int] = []
    monkeypatch.setattr(cuda_compat, "kernel_node_params_with_arguments", lambda node, k, e: node)
    monkeypatch.setattr(
        cuda_compat, "exec_kernel_node_setter", lambda g, node, params: lambda: sent.append(node)
    )
    nodes = [
        NodeArguments(1, [struct.pack("<Q", 0x1000)], None, [HostPatch(0, 0, 0, 0)]),
        NodeArguments(2, [struct.pack("<Q", 0x2000)], None, [HostPatch(0, 0, 0, 1)]),
    ]
    return HostVendorTable(Writer(3), nodes), sent


def test_a_write_before_the_executable_graph_is_sent_when_it_is_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table, sent = _table(monkeypatch)
    assert table.write([0x1000, 0x2800, 0])
    assert sent == []  # no executable graph yet
    table.prepare_launch(0x77, 0)
    assert sent == [2]  # node 1 already held its address
    assert [n.values() for n in table.nodes] == [(0x1000,), (0x2800,)]


def test_unchanged_table_values_send_nothing_and_a_change_sends_its_node_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table, sent = _table(monkeypatch)
    table.prepare_launch(0x77, 0)
    assert table.write([0x1000, 0x2000, 5])  # only the slot no vendor node reads
    assert not table.write([0x1000, 0x2000, 5])
    assert sent == []
    table.write([0x3000, 0x2000, 5])
    assert sent == [1] and table.sends == 1


def test_prepare_launch_without_an_executable_graph_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    table, _ = _table(monkeypatch)
    with pytest.raises(RuntimeError, match="no handle"):
        table.prepare_launch(None, 0)


def test_the_option_defaults_to_host_updates_and_rejects_other_values() -> None:
    from grace.capture import CaptureContext
    from grace.options import GraceOptions, GraceOptionsError

    assert GraceOptions().pi_vendor_update == "host"
    assert CaptureContext.__dataclass_fields__["pi_vendor_update"].default == "host"
    assert GraceOptions.from_value({"pi_vendor_update": "device"}).pi_vendor_update == "device"
    with pytest.raises(GraceOptionsError, match=r"pi_vendor_update must be one of \['host', 'device'\]"):
        GraceOptions(pi_vendor_update="prelude")
