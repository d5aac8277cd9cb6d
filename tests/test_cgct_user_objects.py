"""CGCT leaves the user's objects as they were (issue 18, item 4), on a CPU-only torch.

After CGCT, module attributes, list entries and module globals that were CPU tensors are the same
objects, on the CPU, with the same values (``.numpy()``, ``.item()`` keep working); the graph reads GPU
mirrors that grace owns. A mirror follows its attribute through every write, including writes that do
not move the version counter (``.data``, numpy views), so the next call sees them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_cgct_support import DEVICE_MAP, Twins, capture, real_inputs
from torch._subclasses.fake_tensor import FakeTensorMode

from grace import cgct
from grace.cgct import adapter as adapter_module
from grace.cgct import verify
from grace.cgct.adapter import InputAdapter, MirrorStep, MirrorSync
from grace.cgct.reasons import ReasonCode

_LUT: Any = None  # a module global read by Holder.forward; each test sets it


class Holder(torch.nn.Module):
    """Every kind of CPU state a graph can read: a buffer, a view buffer, a plain tensor attribute, a
    list of tensors and a module global."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        base = torch.arange(8.0).reshape(2, 4)
        self.register_buffer("base", base)
        self.register_buffer("vscale", base[1])  # a view of another buffer
        self.scale = torch.tensor([1.0, 2.0, 3.0, 4.0])
        self.grids = [torch.full((4,), 0.5), torch.linspace(0, 1, 4)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) + self.base.to(x.device).sum(0)
        y = y * self.scale.to(x.device) * self.vscale.to(x.device)
        for grid in self.grids:
            y = y - grid.to(x.device)
        return y + _LUT.to(x.device)


def _state(model: Holder) -> dict[str, Any]:
    return {
        "base": model.base,
        "vscale": model.vscale,
        "scale": model.scale,
        "grids": model.grids,
        "grid0": model.grids[0],
        "grid1": model.grids[1],
        "lut": _LUT,
    }


def _flat(value: Any) -> list[torch.Tensor]:
    return list(value) if isinstance(value, list) else [value]


def _capture_transformed(model: torch.nn.Module, twins: Twins, x: Any) -> list[Any]:
    return capture(model, [x], twins.mode, on_graph=cgct.transform)


def test_fake_cuda_model_keeps_its_cpu_attributes_list_entries_and_globals() -> None:
    global _LUT
    twins = Twins(FakeTensorMode(allow_non_fake_inputs=True))
    fake = twins.module(Holder(), cpu_attributes=["base", "vscale", "scale", "grids"])
    _LUT = twins.fake(torch.tensor([0.25, 0.5, 0.75, 1.0]), torch.device("cpu"))
    before = _state(fake)
    x = twins.inputs(torch.randn(4, 4))[0]
    graphs = _capture_transformed(fake, twins, x)
    assert len(graphs) == 1, "no retrace: nothing of the user's changed"
    after = _state(fake)
    for name, value in before.items():
        assert after[name] is value, f"{name} is another object after CGCT"
    for name in ("base", "vscale", "scale", "grid0", "grid1", "lut"):
        assert after[name].device.type == "cpu", f"{name} is on {after[name].device} after CGCT"
    result = graphs[0].result
    assert result.input_adapter is not None
    steps = [s for s in result.input_adapter.steps if isinstance(s, MirrorStep)]
    assert len(steps) == 6
    mirrored = [d for d in result.diagnoses if d.code is ReasonCode.CPU_ATTRIBUTE and d.transformed]
    assert len(mirrored) == 6 and all("stays on the CPU" in d.message for d in mirrored)
    problems = verify.compare(
        graphs[0].gm, result, real_inputs(graphs[0].example_inputs, twins), DEVICE_MAP, twins.real_of
    )
    assert problems == []


def test_real_cpu_attributes_stay_usable_from_eager_code() -> None:
    """The attributes are real CPU tensors (the rest of the model fake CUDA): after CGCT, ``.numpy()``,
    ``.item()`` and device checks work on them and their values are unchanged."""
    global _LUT
    twins = Twins(FakeTensorMode(allow_non_fake_inputs=True))
    real = Holder()
    fake = twins.module(real)
    fake.base = real.base
    fake.vscale = real.vscale
    fake.scale = real.scale
    fake.grids = real.grids
    _LUT = torch.tensor([0.25, 0.5, 0.75, 1.0])
    before = _state(fake)
    values = {name: _flat(value) for name, value in before.items()}
    values = {name: [t.clone() for t in tensors] for name, tensors in values.items()}
    graphs = _capture_transformed(fake, twins, twins.inputs(torch.randn(4, 4))[0])
    assert len(graphs) == 1
    after = _state(fake)
    for name, value in before.items():
        assert after[name] is value, f"{name} is another object after CGCT"
        for tensor, original in zip(_flat(after[name]), values[name], strict=True):
            assert type(tensor) is torch.Tensor and tensor.device.type == "cpu", name
            assert torch.equal(torch.from_numpy(tensor.numpy()), original), name
    assert fake.scale[1].item() == 2.0
    assert fake.vscale.untyped_storage().data_ptr() == fake.base.untyped_storage().data_ptr()
    mirrors = [s for s in graphs[0].result.input_adapter.steps if isinstance(s, MirrorStep)]
    assert {m.mirror.device.type for m in mirrors} == {"cuda"}


def _mirrored(source: torch.Tensor) -> tuple[InputAdapter, MirrorStep]:
    """A mirror step for ``source`` whose mirror is a CPU tensor standing in for the GPU one."""
    step = MirrorStep(source=source, mirror=source.detach().clone(), index=0)
    return InputAdapter([step]), step


def test_a_write_through_data_to_a_view_buffer_reaches_the_mirror() -> None:
    base = torch.arange(8.0).reshape(2, 4)
    vscale = base[1]
    adapter, step = _mirrored(vscale)
    assert torch.equal(adapter([vscale])[0], vscale)
    version = vscale._version
    vscale.data.mul_(2)  # m.vscale.data.mul_(2): the version counter does not move
    assert vscale._version == version
    out = adapter([vscale])[0]
    assert out is step.mirror and torch.equal(out, base[1]) and torch.equal(out, torch.arange(4.0, 8.0) * 2)
    assert step.refreshes == 1


def test_a_write_through_a_numpy_view_reaches_the_mirror() -> None:
    table = torch.arange(4.0)
    adapter, _ = _mirrored(table)
    adapter([table])
    table.numpy()[2] = 40.0  # shares the memory; no version counter sees it
    assert torch.equal(adapter([table])[0], torch.tensor([0.0, 1.0, 40.0, 3.0]))


def test_bits_not_values_are_compared() -> None:
    """-0.0 == 0.0 as values, but 1/x tells them apart: the mirror must hold the same bits."""
    zero = torch.zeros(2)
    adapter, _ = _mirrored(zero)
    adapter([zero])
    zero.data.neg_()
    assert torch.signbit(adapter([zero])[0]).all()


def test_an_unchanged_attribute_is_not_copied_again() -> None:
    table = torch.arange(4.0)
    adapter, step = _mirrored(table)
    for _ in range(5):
        adapter([table])
    assert step.refreshes == 0
    replaced = torch.arange(4.0) + 1  # the user assigned another tensor to the attribute
    assert torch.equal(adapter([replaced])[0], replaced) and step.refreshes == 1


def test_a_large_attribute_is_copied_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapter_module, "RECHECK_BYTES", 8)
    table = torch.arange(4.0)
    adapter, step = _mirrored(table)
    assert step.sync is MirrorSync.EVERY_CALL
    adapter([table])
    table.data.add_(1)
    assert torch.equal(adapter([table])[0], torch.arange(4.0) + 1)
    assert step.refreshes == 2


def test_a_graph_attribute_mirror_follows_its_attribute() -> None:
    """A ``get_attr`` node's mirror (``index`` None) reads the attribute itself on every call."""
    table = torch.arange(4.0)
    step = MirrorStep(source=table, mirror=table.clone(), index=None)
    InputAdapter([step])([])
    table.data.mul_(3)
    InputAdapter([step])([])
    assert torch.equal(step.mirror, torch.arange(4.0) * 3)


def test_a_strided_view_attribute_is_compared_element_by_element() -> None:
    base = torch.arange(12.0).reshape(3, 4)
    column = base.t()[1]  # a non-contiguous view: no single memcmp covers it
    adapter, step = _mirrored(column)
    adapter([column])
    column.data.mul_(-1)
    assert not column.is_contiguous()
    assert torch.equal(adapter([column])[0], -torch.tensor([1.0, 5.0, 9.0]))
    assert step.refreshes == 1
