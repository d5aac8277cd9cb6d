"""Hoisted CPU inputs on a CUDA device (Note: [A fixed home for hoisted inputs] in grace.cgct.hoist):
a graph with several CPU scalar inputs keeps its graph, reads each call's values from one fixed home,
and an output that is a hoisted input keeps its value after later calls, as in eager. Every call is
compared with eager (float64, or float32 where a graph needs float32 scalars). All tests carry the
``gpu`` marker."""

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


def _options(tmp_path: Path, **changes: Any) -> GraceOptions:
    values: dict[str, Any] = {"cache_dir": str(tmp_path), "scg_samples": 3, "scg_warmup": 0}
    values.update(changes)
    return GraceOptions(**values)


class Scaled(torch.nn.Module):
    """Four Linear layers, each output scaled by a 0-d CPU tensor input, in float32 (with float64 scalars
    Inductor tensorifies them and CGCT's graph is recompiled without CGCT: no graph to check)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(4))

    def forward(self, x: torch.Tensor, *scales: torch.Tensor) -> torch.Tensor:
        for layer, scale in zip(self.layers, scales, strict=True):
            x = torch.relu(layer(x)) * scale.to(x.device)
        return x


def _scales(call: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.tensor(0.5 + 0.1 * i + 0.01 * call) for i in range(4))


@pytest.mark.parametrize("scg", [True, False])
def test_cpu_scalars_are_read_from_a_fixed_home_with_each_calls_values(tmp_path: Path, scg: bool) -> None:
    model = Scaled().to(DEVICE)
    compiled = grace.compile(model, options=_options(tmp_path, scg=scg))
    x = torch.randn(8, 32, device=DEVICE)
    with torch.no_grad():
        for call in range(8):  # float32 against eager float32: the same kernels' rounding aside
            scales = _scales(call)
            torch.testing.assert_close(compiled(x, *scales), model(x, *scales), rtol=1e-5, atol=1e-5)
    records = stats.snapshot()
    assert records and all(r["calls"] >= 1 for r in records)
    if not scg:  # without SCG a graph is kept; its hoisted inputs never move, so it never rebinds
        assert any(r["graph_launches"] > 0 for r in records)
        assert all(r["rebinds"] == 0 and r["recaptures"] == 0 for r in records)


class ReturnsHoisted(torch.nn.Module):
    def forward(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a_dev, b_dev = a.to(x.device), b.to(x.device)
        return x * a_dev + b_dev, a_dev


@pytest.mark.parametrize("clone_outputs", [False, True])
def test_a_returned_hoisted_input_keeps_its_value_after_later_calls(
    tmp_path: Path, clone_outputs: bool
) -> None:
    model = ReturnsHoisted()
    compiled = grace.compile(model, options=_options(tmp_path, clone_outputs=clone_outputs))
    x = torch.randn(16, dtype=torch.float64, device=DEVICE)
    held: list[tuple[torch.Tensor, float]] = []
    with torch.no_grad():
        for call in range(6):
            a = torch.tensor(1.0 + call, dtype=torch.float64)
            b = torch.tensor(-2.0 * call, dtype=torch.float64)
            got, got_a = compiled(x, a, b)
            want, want_a = model(x, a, b)
            torch.testing.assert_close(got, want, **TOL)
            torch.testing.assert_close(got_a, want_a, **TOL)
            held.append((got_a, float(want_a)))
            for kept, value in held:  # every earlier call's hoisted output still has its value
                assert float(kept) == value
