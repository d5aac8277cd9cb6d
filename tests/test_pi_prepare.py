"""grace.pi.stages.prepare on a fake graph: the stages it records, the slots it gives and what it declines.

The driver, Triton and the pointer table are replaced by fakes; the scan, the slot allocation, the
stage log and the copy path of the table are the real ones.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from grace.compat import cuda as cuda_compat
from grace.compat import torch as torch_compat
from grace.cudagraph import KernelNode, KernelParam
from grace.pi import driver, stages, table, vendor
from grace.pi import plan as plan_mod
from grace.pi import triton as triton_path
from grace.pi.plan import PiPlan
from grace.pi_contract import PIStage
from grace.reasons import SkipCode, SkipReason

TRITON_FN, VENDOR_FN = 0xF1, 0xF2
TRITON_NODE, VENDOR_NODE = 10, 20
INPUT0, INPUT1 = 0x10000, 0x20000
DEVICE = torch.device("cuda", 0)


@dataclass(frozen=True)
class Span:
    data_ptr: int
    start: int
    end: int


@dataclass(frozen=True)
class Context:
    graph_handle: int = 0x99
    placeholders: Any = None
    dynamic_input_indices: tuple[int, ...] = (0, 1)
    output_codes: tuple[Any, ...] = ()
    device: torch.device = DEVICE
    pi_table_update: str = "copy"
    pi_vendor_update: str = "device"
    placeholder_spans: Any = None


class FakeTable:
    def __init__(self, slots: int, device: Any) -> None:
        self.slots = slots
        self.writes: list[list[int]] = []

    @property
    def bytes_per_copy(self) -> int:
        return 8 * self.slots

    def address(self, slot: int) -> int:
        return 0xA000 + 8 * slot

    def write(self, values: Sequence[int]) -> bool:
        self.writes.append(list(values))
        return True


def _pointer(index: int, value: int) -> KernelParam:
    return KernelParam(index, 8 * index, 8, struct.pack("<Q", value))


def _nodes() -> list[KernelNode]:
    triton = KernelNode(
        TRITON_NODE,
        TRITON_FN,
        "k",
        (1, 1, 1),
        (1, 1, 1),
        0,
        (_pointer(0, INPUT0), _pointer(1, INPUT1 + 64)),
        None,
    )
    cublas = KernelNode(
        VENDOR_NODE, VENDOR_FN, "nvjet", (1, 1, 1), (1, 1, 1), 0, (_pointer(0, INPUT1),), None
    )
    return [triton, cublas]


def _kernel() -> triton_path.TritonKernel:
    pointer = SimpleNamespace(role=SimpleNamespace(value="pointer"))
    return triton_path.TritonKernel(
        function=TRITON_FN,
        name="k",
        ptx="ptx",
        param_map=SimpleNamespace(params=[pointer, pointer]),  # type: ignore[arg-type]
        alignment={0: 16, 1: 16},
        num_warps=4,
        shared=0,
        enable_fp_fusion=True,
    )


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    calls: dict[str, list[Any]] = {"patch": [], "vendor": [], "build": []}
    monkeypatch.setattr(cuda_compat, "driver", lambda: object())
    monkeypatch.setattr(cuda_compat, "has_param_info", lambda: True)
    monkeypatch.setattr(torch_compat, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(plan_mod, "graph_nodes_for_scan", lambda graph: (_nodes(), [], {}))
    monkeypatch.setattr(triton_path, "located_kernels", lambda codes: {TRITON_FN: _kernel()})

    def build(kernel: Any, indices: Sequence[int], capability: int, device_index: int) -> Any:
        calls["build"].append((list(indices), capability, device_index))
        return SimpleNamespace(function=0xB1)

    monkeypatch.setattr(triton_path, "build", build)
    monkeypatch.setattr(driver, "patch_kernel_node", lambda *args: calls["patch"].append(args))

    def install(graph: int, slots: list[Any], table_address: int, device: Any, capability: int) -> Any:
        calls["vendor"].append(slots)
        return SimpleNamespace(patches=list(slots))

    monkeypatch.setattr(vendor, "install", install)
    monkeypatch.setattr(table, "PointerTable", FakeTable)
    return calls


def _context() -> Context:
    spans = {0: Span(INPUT0, INPUT0, INPUT0 + 256), 1: Span(INPUT1, INPUT1, INPUT1 + 256)}
    return Context(placeholder_spans=spans)


def test_every_stage_passes_and_each_input_view_gets_a_slot(patched: dict[str, list[Any]]) -> None:
    result = stages.prepare(_context())
    assert isinstance(result, PiPlan), result
    assert [(s, st) for s, st, _ in result.stages] == [
        ("locate", "pass"),
        ("rewrite", "pass"),
        ("assemble", "pass"),
        ("load", "pass"),
        ("vendor_match", "pass"),
        ("patch", "pass"),
        ("vendor_update", "pass"),
        ("table", "pass"),
    ]
    assert patched["build"] == [([0, 1], 90, 0)]
    ((node, function, values),) = patched["patch"]
    assert (node, function) == (TRITON_NODE, 0xB1)
    assert values == {0: struct.pack("<Q", 0xA000), 1: struct.pack("<Q", 0xA008)}  # slots 0 and 1
    assert patched["vendor"] == [[(VENDOR_NODE, 0, 2)]]  # input 1 without offset: a third slot
    assert result.uncovered_indices == () and result.slot_count == 3
    assert result.bytes_per_replay == 24


def test_a_vendor_node_that_cannot_be_updated_leaves_its_input_copied(
    patched: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any) -> Any:
        raise vendor.VendorError(PIStage.VENDOR_UPDATE, "no prelude")

    monkeypatch.setattr(vendor, "install", refuse)
    result = stages.prepare(_context())
    assert isinstance(result, PiPlan), result
    by_stage = {s: (st, m) for s, st, m in result.stages}
    assert by_stage["vendor_update"] == ("fail", "no prelude")
    assert by_stage["patch"][0] == "pass" and by_stage["table"][0] == "pass"
    assert result.uncovered_indices == (1,)
    assert result.uncovered_reasons == {1: "vendor path: no prelude"}


def test_no_servable_input_is_a_skip_reason(
    patched: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any) -> Any:
        raise vendor.VendorError(PIStage.VENDOR_UPDATE, "no prelude")

    def fail(*args: Any) -> Any:
        raise triton_path.BuildError(PIStage.LOAD, "no module")

    monkeypatch.setattr(vendor, "install", refuse)
    monkeypatch.setattr(triton_path, "build", fail)
    result = stages.prepare(_context())
    assert isinstance(result, SkipReason) and result.code is SkipCode.PI_FAILED
    assert "input 0: load of k failed: no module" in result.detail
    assert "input 1:" in result.detail


def test_without_bindings_prepare_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_compat, "driver", lambda: None)
    result = stages.prepare(_context())
    assert isinstance(result, SkipReason) and result.code is SkipCode.CUDA_BINDINGS_MISSING


def _at(address: int) -> Any:
    """A stand-in CUDA tensor at ``address``."""
    return SimpleNamespace(data_ptr=lambda: address, is_cuda=True)


def _host_plan(monkeypatch: pytest.MonkeyPatch) -> tuple[PiPlan, list[tuple[int, int]]]:
    """A plan prepared under ``pi_vendor_update="host"``, bound to a fake executable graph; the list
    receives (node, address the node's copy holds) at each update sent."""
    from dataclasses import replace

    sent: list[tuple[int, int]] = []

    def params_with(node: int, kernel_params: int, extra: int) -> Any:
        return SimpleNamespace(node=node, kernel_params=kernel_params)

    def setter(graph_exec: int, node: int, params: Any) -> Any:
        def send() -> None:
            slot = ctypes.c_void_p.from_address(params.kernel_params).value
            sent.append((node, struct.unpack("<Q", ctypes.string_at(slot, 8))[0]))

        return send

    monkeypatch.setattr(cuda_compat, "kernel_node_params_with_arguments", params_with)
    monkeypatch.setattr(cuda_compat, "exec_kernel_node_setter", setter)
    result = stages.prepare(replace(_context(), pi_vendor_update="host"))
    assert isinstance(result, PiPlan), result
    result.prepare_launch(0x77, 0)
    return result, sent


def test_host_vendor_updates_send_a_vendor_node_only_when_its_address_changes(
    patched: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan, sent = _host_plan(monkeypatch)
    by_stage = {s: (st, m) for s, st, m in plan.stages}
    status, message = by_stage["vendor_update"]
    assert status == "pass" and "host updates of 1 addresses" in message
    assert patched["vendor"] == []  # no prelude, no device-updatable node
    assert plan.vendor_setups == [] and plan.health() is None
    moved0, moved1 = 0x50000, 0x60000
    args = [_at(moved0), _at(moved1)]
    assert plan.update(args)
    assert sent == [(VENDOR_NODE, moved1)]  # the vendor node reads input 1 without an offset
    assert plan.update(args)
    assert sent == [(VENDOR_NODE, moved1)]  # same addresses: nothing sent
    args[0] = _at(moved0 + 4096)
    assert plan.update(args)
    assert sent == [(VENDOR_NODE, moved1)]  # only the Triton node's input moved
    args[1] = _at(INPUT1)
    assert plan.update(args)
    assert sent == [(VENDOR_NODE, moved1), (VENDOR_NODE, INPUT1)]
