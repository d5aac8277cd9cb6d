"""The backend never raises for its own failures, on a CUDA device: a failure injected into the deciding
call (grace's run path) or into the mutation analysis (its compile path) gives eager's values on every
call, with the reason recorded once. Every call compared with eager in float64; marker ``gpu``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import grace
from grace import backend, stats
from grace.options import GraceOptions

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_grace")]

TOL = {"rtol": 1e-9, "atol": 1e-9}
DEVICE = torch.device("cuda", 0)


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(64, 64, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * 2


def _run(tmp_path: Path, calls: int = 5) -> None:
    model = Small().to(DEVICE)
    options = GraceOptions(cache_dir=str(tmp_path), scg_samples=3, scg_warmup=0)
    compiled = grace.compile(model, options=options)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    for i in range(calls):
        x = torch.randn(8, 64, dtype=torch.float64, device=DEVICE, generator=generator)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), **TOL, msg=lambda m, i=i: f"call {i}: {m}")


def test_a_failing_deciding_call_gives_eagers_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import grace.decide

    def broken(facts: Any, args: Any) -> Any:
        raise RuntimeError("injected failure in the deciding call")

    monkeypatch.setattr(grace.decide, "decide", broken)
    _run(tmp_path)
    assert stats.fallback_counts().get("runner_failed") == 1


def test_a_failing_analysis_gives_eagers_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(gm: Any, example_inputs: Any) -> Any:
        raise RuntimeError("injected failure in the mutation analysis")

    monkeypatch.setattr(backend, "graph_effects", broken)
    _run(tmp_path)
    assert stats.fallback_counts().get("backend_failed") == 1
