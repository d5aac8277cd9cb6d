"""A training step's pool on a CUDA device (option ``step_pool``; Note: [What a replay can overwrite] in
grace.poolgroups): a once-a-step compiled piece hands out a result its caller drops at once, beside the
tensor autograd keeps for its backward; one compiled layer then serves two layers. The layer's capture
may take the dropped result's memory, and its replays must wait for that result only, never for the
kept tensor: every step equals eager's (float64, tolerance 1e-9) and the layer keeps a set per layer,
none refused for another member's output. Marker ``gpu``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from grace import backend, poolgroups, stats
from grace.options import GraceOptions

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_grace")]

DEVICE = torch.device("cuda", 0)
TOL = {"rtol": 1e-9, "atol": 1e-9}
STEPS = 6


def _once(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ w)  # gelu's backward keeps its input, an intermediate


def _layer(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(h @ w) + h


def _loss(once: Any, layer: Any, x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    result = once(x, weights[0])
    h = result * 2.0  # in eager, outside the compiled pieces; the result is dropped right after
    del result
    for w in weights[1:]:
        h = layer(h, w)
    return h.pow(2).mean()


def _weights() -> list[torch.Tensor]:
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    return [
        torch.nn.Parameter(0.1 * torch.randn(64, 64, dtype=torch.float64, device=DEVICE, generator=generator))
        for _ in range(3)
    ]


def _met_only_a_dropped_output() -> bool:
    """Whether a member's footprint met some of another member's outputs but none it keeps, where that
    member keeps others: the case the per-storage check is for."""
    for group in poolgroups.step_groups():
        for seat in group.seats():
            for over in seat.overwrites:
                family = over.seat.graph.family
                part = over.part
                if part is None or not part.indices or not any(family.kept):
                    continue
                if not any(family.kept[i] for i in part.indices if i < len(family.kept)):
                    return True
    return False


def test_a_layer_captured_over_a_dropped_result_replays_while_the_kept_tensor_lives(tmp_path: Path) -> None:
    eager_w = _weights()
    model_w = [torch.nn.Parameter(w.detach().clone()) for w in eager_w]
    options = GraceOptions(
        cache_dir=str(tmp_path), scg_samples=3, scg_warmup=0, training=True, scg=False, step_pool=True
    )
    grace_backend = backend.GraceBackend(options)
    once, layer = torch.compile(_once, backend=grace_backend), torch.compile(_layer, backend=grace_backend)
    for step in range(STEPS):
        torch.compiler.cudagraph_mark_step_begin()
        generator = torch.Generator(device=DEVICE).manual_seed(100 + step)
        x = torch.randn(16, 64, dtype=torch.float64, device=DEVICE, generator=generator)
        loss_e = _loss(_once, _layer, x, eager_w)
        loss_e.backward()
        loss_g = _loss(once, layer, x, model_w)
        loss_g.backward()
        torch.testing.assert_close(loss_g, loss_e, **TOL, msg=lambda m, s=step: f"loss, step {s}: {m}")
        with torch.no_grad():
            for k, (p, q) in enumerate(zip(eager_w, model_w, strict=True)):
                assert q.grad is not None, f"step {step}: no gradient for weight {k}"
                torch.testing.assert_close(
                    q.grad, p.grad, **TOL, msg=lambda m, s=step, i=k: f"grad {i}, {s}: {m}"
                )
                p -= 0.05 * p.grad
                q -= 0.05 * q.grad
                p.grad = q.grad = None
    records = stats.snapshot()
    refused = {
        r["graph_id"]: r["set_blocks"] for r in records if any("overwrite" in k for k in r["set_blocks"])
    }
    assert not refused, refused
    assert max(r["graphs_held"] for r in records) <= 3, [(r["graph_id"], r["graphs_held"]) for r in records]
    assert sum(r["graph_launches"] for r in records) >= 2 * (STEPS - 2), records
    assert _met_only_a_dropped_output(), "no capture took a dropped output's memory: this test checks nothing"
