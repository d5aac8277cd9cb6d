"""CGCT end to end on a CUDA device (issue 18, items 4 and 6): the user's CPU attributes, list entries
and globals stay as they were, writes that no version counter sees reach the next call, and a graph with
CPU inputs of which some are hoisted and some not compiles and runs. Every call is compared with eager
in float64. All tests carry the ``gpu`` marker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import grace
from grace import stats
from grace.options import GraceOptions

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_grace")]

TOL = {"rtol": 1e-9, "atol": 1e-9}
DEVICE = torch.device("cuda", 0)
_TABLE: Any = None  # a module global the model reads; each test sets it


def _options(tmp_path: Path, **changes: Any) -> GraceOptions:
    values: dict[str, Any] = {"cache_dir": str(tmp_path), "scg_samples": 3, "scg_warmup": 0}
    values.update(changes)
    return GraceOptions(**values)


class Holder(torch.nn.Module):
    """GPU weights, and CPU state of every kind: a buffer, a view buffer, a plain tensor attribute, a
    list of tensors, a large buffer and a module global."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16, dtype=torch.float64)
        self.register_buffer("lut", torch.linspace(-1, 1, 16, dtype=torch.float64))
        base = torch.arange(32, dtype=torch.float64).reshape(2, 16) / 16
        self.register_buffer("vscale", base[1])  # a view of a tensor the module does not hold
        self.register_buffer("big", torch.linspace(0, 1, 1 << 18, dtype=torch.float64))  # 2 MiB
        self.scale = torch.full((16,), 0.5, dtype=torch.float64)
        self.grids = [torch.full((16,), 0.25, dtype=torch.float64), torch.linspace(0, 1, 16).double()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) * self.scale.to(x.device) + self.lut.to(x.device)
        y = y * self.vscale.to(x.device) + self.big.to(x.device)[:16]
        for grid in self.grids:
            y = y - grid.to(x.device)
        return y + _TABLE.to(x.device)


def _cpu_state(model: Holder) -> dict[str, Any]:
    return {
        "lut": model.lut,
        "vscale": model.vscale,
        "big": model.big,
        "scale": model.scale,
        "grid0": model.grids[0],
        "grid1": model.grids[1],
        "table": _TABLE,
    }


def test_cpu_attributes_stay_on_the_cpu_and_writes_reach_the_graph(tmp_path: Path) -> None:
    global _TABLE
    _TABLE = torch.linspace(2, 3, 16, dtype=torch.float64)
    model = Holder()
    model.lin.to(DEVICE)
    before = _cpu_state(model)
    grids = model.grids
    compiled = grace.compile(model, options=_options(tmp_path))
    generator = torch.Generator(device=DEVICE).manual_seed(0)

    def check(step: str) -> None:
        for i in range(3):
            x = torch.randn(4, 16, dtype=torch.float64, device=DEVICE, generator=generator)
            with torch.no_grad():
                expected = model(x)
                got = compiled(x)
            torch.testing.assert_close(got, expected, **TOL, msg=lambda m, i=i: f"{step}, call {i}: {m}")

    check("first calls")
    after = _cpu_state(model)
    assert model.grids is grids
    for name, value in before.items():
        assert after[name] is value, f"{name} is another object after compiling"
        assert value.device.type == "cpu", f"{name} is on {value.device} after compiling"
        value.numpy()  # eager-valid code keeps working
    assert model.scale[0].item() == 0.5

    model.vscale.data.mul_(2)  # the version counter does not move
    check("after vscale.data.mul_(2)")
    model.lut.numpy()[3] = 7.0  # a write through a numpy view
    check("after a numpy write to lut")
    model.big.data.add_(1)  # a large buffer: copied on every call
    check("after big.data.add_(1)")
    model.grids[1].data.neg_()
    _TABLE.data.fill_(-1.5)
    check("after writes to a list entry and a global")
    model.scale = torch.full((16,), 3.0, dtype=torch.float64)  # another tensor for the attribute
    check("after reassigning scale")


def test_several_cpu_inputs_some_hoisted_some_not(tmp_path: Path) -> None:
    """The crash of issue 18 (item 6): CPU inputs of which CGCT hoists two (they only feed the GPU) and
    not two others (one is returned, one is read on the host), with default options."""

    def model(
        x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * a.to(x.device) + c.to(x.device)
        return y * float(d.sum()), b * 3

    compiled = grace.compile(model, options=_options(tmp_path))
    generator = torch.Generator().manual_seed(1)
    for i in range(4):
        x = torch.randn(8, dtype=torch.float64, device=DEVICE)
        a, b, c, d = (torch.randn(8, dtype=torch.float64, generator=generator) for _ in range(4))
        with torch.no_grad():
            expected = model(x, a, b, c, d)
            got = compiled(x, a, b, c, d)
        for want, have in zip(expected, got, strict=True):
            assert have.device == want.device
            torch.testing.assert_close(have, want, **TOL, msg=lambda m, i=i: f"call {i}: {m}")
    codes = {r["code"] for record in stats.snapshot() for r in record["skip_reasons"]}
    assert "runner_failed" not in codes
