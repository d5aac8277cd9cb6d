"""The fill node (grace.pi.fill) on CPU: option, buckets, parameter bytes, NVRTC, fallbacks, updates.

Driver calls are replaced by fakes that record what they were given; the GPU half (numerics, launches
queued while the node's parameters change) is in tests/test_pi_gpu.py.
"""

from __future__ import annotations

import ctypes
import importlib.util
import struct
from collections.abc import Callable
from typing import Any

import pytest
import torch

from grace.capture import CaptureContext
from grace.compat import cuda as cuda_compat
from grace.compat import torch as torch_compat
from grace.options import GraceOptions, GraceOptionsError
from grace.pi import driver, fill, nvrtc
from grace.pi.plan import PiPlan, Slot, StageLog
from grace.pi.table import PointerTable

# --- option ------------------------------------------------------------------------------------------


def test_table_update_option_defaults_to_node_and_reaches_the_capture_context() -> None:
    assert GraceOptions().pi_table_update == "node"
    assert GraceOptions.from_value({"pi_table_update": "copy"}).pi_table_update == "copy"
    field = CaptureContext.__dataclass_fields__["pi_table_update"]
    assert field.default == GraceOptions().pi_table_update


@pytest.mark.parametrize("value", ["memcpy", "NODE", "", None, 1])
def test_table_update_option_rejects_other_values(value: object) -> None:
    with pytest.raises(GraceOptionsError, match=r"pi_table_update must be one of \['copy', 'node'\]"):
        GraceOptions(pi_table_update=value)  # type: ignore[arg-type]


# --- buckets and parameter bytes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slots", "expected"),
    [(1, 8), (8, 8), (9, 16), (64, 64), (65, 128), (256, 256), (257, 511), (511, 511), (512, None)],
)
def test_bucket(slots: int, expected: int | None) -> None:
    assert fill.bucket(slots) == expected


def test_bucket_rejects_an_empty_table() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        fill.bucket(0)


def test_every_layout_fits_the_parameter_block_and_few_variants_exist() -> None:
    sizes = {fill.FillLayout.for_slots(n).bucket for n in range(1, fill.MAX_FILL_SLOTS + 1)}
    assert sizes == {8, 16, 32, 64, 128, 256, 511}
    assert fill.FillLayout.for_slots(fill.MAX_FILL_SLOTS).param_block_bytes == 4096
    assert all(fill.FillLayout(n, n).param_block_bytes <= 4096 for n in sizes)
    with pytest.raises(fill.FillUnavailable, match="512 slots exceed") as info:
        fill.FillLayout.for_slots(512)
    assert info.value.status == "skip"


def test_parameter_bytes_are_exact() -> None:
    layout = fill.FillLayout.for_slots(3)
    assert (layout.bucket, layout.block, layout.param_block_bytes) == (8, (3, 1, 1), 72)
    assert layout.table_param(0x7F00_1234_5600) == bytes.fromhex("0056341200 7f0000".replace(" ", ""))
    packed = layout.values_param([1, 0x1122334455667788, 2**64 - 1])
    assert packed == (
        bytes.fromhex("0100000000000000")
        + bytes.fromhex("8877665544332211")
        + bytes.fromhex("ffffffffffffffff")
        + bytes(40)
    )
    with pytest.raises(ValueError, match="2 values for 3 slots"):
        layout.values_param([1, 2])


# --- NVRTC -------------------------------------------------------------------------------------------


def _nvrtc_missing() -> str | None:
    try:
        nvrtc.bindings().nvrtcVersion()
    except Exception as exc:
        return f"NVRTC not usable here: {type(exc).__name__}: {exc}"
    return None


@pytest.mark.skipif(importlib.util.find_spec("cuda") is None, reason="cuda-bindings not installed")
@pytest.mark.parametrize("slots", [8, 64, 511])
def test_fill_source_compiles_for_sm90(slots: int) -> None:
    missing = _nvrtc_missing()
    if missing:
        pytest.skip(missing)
    ptx = fill.compile_fill(slots, 90).decode()
    assert ".entry grace_pi_fill(" in ptx and ".target sm_90" in ptx
    assert ".param .u64 grace_pi_fill_param_0" in ptx
    assert f".b8 grace_pi_fill_param_1[{8 * slots}]" in ptx  # the values, by value, one parameter
    assert "st.global.u64" in ptx


def test_nvrtc_lowers_the_ptx_version_to_what_the_driver_reads() -> None:
    ptx = b"//\n.version 9.5\n.target sm_90\n"
    assert nvrtc.lower_ptx_version(ptx, 12040) == b"//\n.version 8.4\n.target sm_90\n"
    assert nvrtc.lower_ptx_version(ptx, 13000) == b"//\n.version 9.0\n.target sm_90\n"
    assert nvrtc.lower_ptx_version(ptx, 12030) is None  # a driver older than PI supports
    assert nvrtc.lower_ptx_version(ptx, None) is None
    assert nvrtc.lower_ptx_version(b".version 8.4\n", 12040) is None  # nothing to lower


# --- serve: which path writes the table --------------------------------------------------------------


class FakeDriver:
    """Records the graph edits ``serve`` makes; ``fail`` names a step that raises."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: set[str] | None = None) -> None:
        self.fail = fail or set()
        self.added: list[tuple[int, int, tuple[int, int, int], tuple[int, int, int], bytes, bytes]] = []
        self.edges: list[tuple[int, int, list[int]]] = []
        self.removed: list[int] = []
        self.setter_calls: list[bytes] = []
        self.compiled: list[tuple[int, int, int]] = []
        monkeypatch.setattr(torch_compat, "has_raw_cuda_graph_exec", lambda: True)
        monkeypatch.setattr(cuda_compat, "has_exec_kernel_node_set_params", lambda: True)
        monkeypatch.setattr(nvrtc, "bindings", self._bindings)
        monkeypatch.setattr(fill, "fill_function", self._function)
        monkeypatch.setattr(cuda_compat, "graph_root_nodes", lambda graph: [11, 12])
        monkeypatch.setattr(driver, "add_kernel_node", self._add)
        monkeypatch.setattr(cuda_compat, "graph_add_dependencies", self._depend)
        monkeypatch.setattr(driver, "remove_node", self._remove)
        monkeypatch.setattr(cuda_compat, "kernel_node_params_reading", self._params)
        monkeypatch.setattr(cuda_compat, "exec_kernel_node_setter", self._setter)

    def _step(self, name: str) -> None:
        if name in self.fail:
            raise RuntimeError(f"{name} refused")

    def _bindings(self) -> Any:
        if "nvrtc" in self.fail:
            raise nvrtc.NvrtcError("NVRTC bindings unavailable: no module named cuda")
        return object()

    def _function(self, layout: fill.FillLayout, capability: int, device_index: int) -> int:
        self._step("compile")
        self.compiled.append((layout.bucket, capability, device_index))
        return 0xF00

    def _add(self, graph: int, function: int, grid: Any, block: Any, params: driver.ParamBuffer) -> int:
        self._step("add")
        self.added.append((graph, function, grid, block, _arg(params, 0, 8), _arg(params, 1, 64)))
        return 99

    def _depend(self, graph: int, before: int, after: list[int]) -> None:
        self._step("depend")
        self.edges.append((graph, before, list(after)))

    def _remove(self, node: int) -> None:
        self._step("remove")
        self.removed.append(node)

    def _params(self, node: int, kernel_params: int) -> dict[str, int]:
        return {"node": node, "kernel_params": kernel_params}

    def _setter(self, graph_exec: int, node: int, params: dict[str, int]) -> Callable[[], None]:
        self._step("bind")

        def set_params() -> None:
            self._step("set")
            # What the driver would read: the second argument of the array the params point at.
            self.setter_calls.append(_arg_at(params["kernel_params"], 1, 24))

        return set_params


def _arg_at(array: int, index: int, size: int) -> bytes:
    pointer = ctypes.c_void_p.from_address(array + 8 * index).value
    assert pointer
    return ctypes.string_at(pointer, size)


def _arg(params: driver.ParamBuffer, index: int, size: int) -> bytes:
    return _arg_at(params.address, index, size)


def _serve(table: PointerTable, mode: str = "node", capturing: bool = False) -> tuple[Any, StageLog]:
    stages = StageLog()
    served = fill.serve(
        0x6000,
        table,
        [0x1000, 0x2000, 0x2040][: table.slots],
        mode,
        capturing=capturing,
        capability=90,
        device_index=0,
        stages=stages,
    )
    return served, stages


def _table(slots: int = 3) -> PointerTable:
    return PointerTable(slots, torch.device("cpu"))


def test_copy_mode_keeps_the_copy_table(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDriver(monkeypatch)
    table = _table()
    served, stages = _serve(table, mode="copy")
    assert served is table and fake.added == []
    assert stages.entries == [
        ("table", "pass", "copy: 3 slots written by one host-to-device copy of 24 bytes per replay "
         "(pi_table_update='copy')")
    ]  # fmt: skip


def test_node_mode_adds_the_fill_node_ahead_of_every_root(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDriver(monkeypatch)
    table = _table()
    served, stages = _serve(table)
    assert isinstance(served, fill.FillTable)
    values = struct.pack("<3Q", 0x1000, 0x2000, 0x2040) + bytes(40)
    assert fake.compiled == [(8, 90, 0)]
    assert fake.added == [(0x6000, 0xF00, (1, 1, 1), (3, 1, 1), struct.pack("<Q", table.address(0)), values)]
    assert fake.edges == [(0x6000, 99, [11, 12])]
    assert [(s, st) for s, st, _ in stages.entries] == [("table", "pass")]
    assert stages.entries[0][2].startswith("node: a fill kernel node (8-slot variant) ahead of the graph's 2")
    assert (served.address(2), served.bytes_per_copy) == (table.address(2), 24)


@pytest.mark.parametrize(
    ("setup", "status", "message"),
    [
        ("capturing", "skip", "still being captured"),
        ("no_exec", "skip", "no executable graph handle"),
        ("no_setter", "skip", "no cuGraphExecKernelNodeSetParams"),
        ("too_many", "skip", "600 slots exceed the fill kernel's parameter block"),
        ("nvrtc", "skip", "NVRTC bindings unavailable"),
        ("compile", "fail", "building the fill kernel: RuntimeError: compile refused"),
        ("add", "fail", "adding the fill node: RuntimeError: add refused"),
        ("depend", "fail", "ordering the fill node before the graph's roots"),
    ],
)
def test_every_reason_the_node_cannot_serve_falls_back_to_the_copy_table(
    monkeypatch: pytest.MonkeyPatch, setup: str, status: str, message: str
) -> None:
    fake = FakeDriver(monkeypatch, fail={setup})
    if setup == "no_exec":
        monkeypatch.setattr(torch_compat, "has_raw_cuda_graph_exec", lambda: False)
    if setup == "no_setter":
        monkeypatch.setattr(cuda_compat, "has_exec_kernel_node_set_params", lambda: False)
    table = _table(600 if setup == "too_many" else 3)
    stages = StageLog()
    served = fill.serve(
        0x6000,
        table,
        list(range(0, 8 * table.slots, 8)),
        "node",
        capturing=setup == "capturing",
        capability=90,
        device_index=0,
        stages=stages,
    )
    assert served is table
    ((stage, got_status, got_message),) = stages.entries
    assert (stage, got_status) == ("table", status)
    assert message in got_message and got_message.startswith("copy: ")
    assert "pi_table_update='node'" in got_message
    # A node that was added and could not be ordered is taken out again; otherwise none was added.
    assert fake.removed == ([99] if setup == "depend" else [])


def test_a_fill_node_that_cannot_be_taken_out_declines_pi(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeDriver(monkeypatch, fail={"depend", "remove"})
    with pytest.raises(fill.FillUnsafe, match="removing it again: RuntimeError: remove refused"):
        _serve(_table())


# --- FillTable: per-call updates ---------------------------------------------------------------------


def test_writes_wait_for_the_executable_graph_then_update_only_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeDriver(monkeypatch)
    served, _ = _serve(_table())
    with pytest.raises(RuntimeError, match="prepare_launch must run first"):
        served.write([0x5000, 0x6000, 0x6040])
    assert served.write([0x1000, 0x2000, 0x2040]) is False  # what the graph was instantiated with
    with pytest.raises(RuntimeError, match="no executable graph handle"):
        served.prepare_launch(None, 7)
    served.prepare_launch(0xE0, 7)
    assert fake.setter_calls == [struct.pack("<3Q", 0x1000, 0x2000, 0x2040)]  # sent once when bound
    assert served.write([0x5000, 0x6000, 0x6040]) is True
    assert served.write([0x5000, 0x6000, 0x6040]) is False
    assert served.write([0x7000, 0x6000, 0x6040]) is True
    assert fake.setter_calls[1:] == [
        struct.pack("<3Q", 0x5000, 0x6000, 0x6040),
        struct.pack("<3Q", 0x7000, 0x6000, 0x6040),
    ]
    assert (served.copies, served.skipped) == (2, 2)
    served.forget()
    assert served.write([0x7000, 0x6000, 0x6040]) is True
    with pytest.raises(ValueError, match="2 values for 3 slots"):
        served.write([1, 2])


def test_a_failed_update_is_not_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDriver(monkeypatch)
    served, _ = _serve(_table())
    served.prepare_launch(0xE0, 7)
    fake.fail.add("set")
    with pytest.raises(RuntimeError, match="set refused"):
        served.write([0x5000, 0x6000, 0x6040])
    fake.fail.clear()
    assert served.write([0x5000, 0x6000, 0x6040]) is True  # retried, not skipped as unchanged


@pytest.mark.parametrize("step", ["bind", "set"])
def test_plan_prepare_launch_raises_and_records_when_the_node_cannot_be_updated(
    monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    fake = FakeDriver(monkeypatch)
    served, stages = _serve(_table())
    plan = PiPlan(
        served, [Slot(0, 0, 16), Slot(1, 0, 16), Slot(1, 64, 16)], {0: 0x1000, 1: 0x2000}, (0, 1), {}, stages
    )
    fake.fail.add(step)
    with pytest.raises(RuntimeError, match=f"{step} refused"):
        plan.prepare_launch(0xE0, 7)
    assert plan.stages[-1][:2] == ("table", "fail")
    assert f"{step} refused" in plan.stages[-1][2]


def test_plan_prepare_launch_binds_the_fill_node(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDriver(monkeypatch)
    served, stages = _serve(_table())
    plan = PiPlan(
        served, [Slot(0, 0, 16), Slot(1, 0, 16), Slot(1, 64, 16)], {0: 0x1000, 1: 0x2000}, (0, 1), {}, stages
    )
    plan.prepare_launch(0xE0, 7)
    assert len(fake.setter_calls) == 1 and plan.bytes_per_replay == 24


@pytest.mark.skipif(cuda_compat.driver() is None, reason="cuda-bindings not installed")
def test_kernel_node_params_take_the_argument_array_by_address() -> None:
    """The bindings store an int ``kernelParams`` as the array pointer itself (CUDA_KERNEL_NODE_PARAMS:
    func, grid and block dims, shared memory, then kernelParams at byte 40 and extra at 48)."""
    params = cuda_compat.driver().CUDA_KERNEL_NODE_PARAMS()
    buffer = driver.ParamBuffer([b"\x01" * 8, b"\x02" * 64])
    cuda_compat.with_kernel_params(params, buffer.address)
    raw = ctypes.string_at(int(params.getPtr()), 56)
    assert struct.unpack_from("<QQ", raw, 40) == (buffer.address, 0)
    assert int(params.kernelParams) == buffer.address
