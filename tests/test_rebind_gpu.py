"""grace.rebind on a CUDA device: a captured graph edited to read its static inputs elsewhere computes
what a capture at those addresses computes (cuBLAS and elementwise kernels), and a model whose layer body
is one compiled piece called per layer keeps one pool and one set of outputs for all layers where a
layer's outputs are dead before the next layer, a graph per layer where the next layer reads them, with
numerics equal to eager. All tests carry ``gpu``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from grace import stats
from grace.backend import GraceBackend
from grace.capture import capture_graph, run_on_side_stream
from grace.compat import torch as torch_compat
from grace.options import GraceOptions
from grace.rebind import rebind
from suites.harness import memory_window_base

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_grace")]

TOL = {"rtol": 2e-3, "atol": 2e-3}


def _save(name: str, payload: Any) -> None:
    directory = os.environ.get("GRACE_TEST_ARTIFACTS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"{name}.json").write_text(json.dumps(payload, indent=1, default=str))


def _affine(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w + b) * 2.0


@pytest.mark.skipif(not torch_compat.has_keep_graph(), reason="this torch does not keep captured graphs")
def test_a_rebound_graph_reads_the_static_inputs_at_their_new_addresses() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    w, b = torch.randn(256, 256, device=device), torch.randn(256, device=device)
    x = torch.randn(64, 256, device=device)
    run_on_side_stream(_affine, (w, b, x), device)  # warm-up on the capture stream, as the runner does
    graph = capture_graph(
        _affine, (w, b, x), device=device, dynamic_indices=(2,), static_indices=(0, 1),
        mutated_indices=(), keep_pristine=True,
    )  # fmt: skip
    assert graph.pristine
    w2, b2 = torch.randn_like(w), torch.randn_like(b)  # another layer's parameters, elsewhere
    other = rebind(graph, (w2, b2, x))
    try:
        assert other.origin is graph and graph.sharers == 1
        assert other.static_inputs_unmoved((w2, b2, x)) and not other.static_inputs_unmoved((w, b, x))
        got = other.run_with_copies((w2, b2, x), clone=True)
        torch.testing.assert_close(got, _affine(w2, b2, x), **TOL)
        x2 = torch.randn_like(x)
        torch.testing.assert_close(graph.run_with_copies((w, b, x2), clone=True), _affine(w, b, x2), **TOL)
        torch.testing.assert_close(
            other.run_with_copies((w2, b2, x2), clone=True), _affine(w2, b2, x2), **TOL
        )
        # one pool and one set of outputs for both
        assert other.outputs[0].data_ptr() == graph.outputs[0].data_ptr()
        side = torch.cuda.Stream()  # a replay on another stream waits for the family's last one
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got = other.run_with_copies((w2, b2, x), clone=True)
        assert graph.last_stream == side
        torch.cuda.current_stream().wait_stream(side)
        torch.testing.assert_close(got, _affine(w2, b2, x), **TOL)
        torch.testing.assert_close(graph.run_with_copies((w, b, x), clone=True), _affine(w, b, x), **TOL)
        assert graph.last_stream == torch.cuda.current_stream()
    finally:
        graph.release()
        other.release()
    assert graph.sharers == 0 and graph.pristine is None


class _BrokenLayer(torch.nn.Module):
    """A layer whose body Dynamo compiles once, in two pieces, and calls for every layer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.up(x))
        torch._dynamo.graph_break()
        return x + self.down(h) * 0.5


class Layered(torch.nn.Module):
    def __init__(self, width: int = 512, depth: int = 4) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_BrokenLayer(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("pi", [True, False])
def test_layers_share_one_pool_and_equal_eager(pi: bool, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Layered().cuda().eval()
    options = GraceOptions(cache_dir=str(tmp_path), scg=False, pi=pi)
    compiled = torch.compile(model, backend=GraceBackend(options))
    with torch.no_grad():
        x = torch.randn(128, 512, device="cuda")
        for call in range(6):
            if call == 4:
                x = torch.randn(128, 512, device="cuda")  # new values, new address
            torch.testing.assert_close(compiled(x), model(x), **TOL, msg=f"call {call}")
    records = stats.snapshot()
    _save(f"rebind_layers_{'pi' if pi else 'copies'}", records)
    graphs = [r for r in records if r["variant"] in ("graph_pi", "graph_copies")]
    for r in graphs:
        assert r["graphs_held"] == 4 and r["rebinds"] + r["recaptures"] == 3, r
        assert "numeric_mismatch" not in {s["code"] for s in r["skip_reasons"]}, r
    # The first piece's outputs (the 128x2048 gelu) are dead before the next layer: one set for four
    # layers. The second piece's output is the next layer's input: each layer keeps a graph of its own.
    (first,) = [r for r in graphs if r["rebinds"]]
    assert (first["rebinds"], first["output_bytes_held"]) == (3, 128 * 2048 * 4), first
    (second,) = [r for r in graphs if not r["rebinds"]]
    assert second["recaptures"] == 3 and second["output_bytes_held"] == 4 * 128 * 512 * 4, second
    assert "rebind_declined" in {s["code"] for s in second["skip_reasons"]}, second


def test_reset_releases_every_graph_of_a_family_and_its_pool(tmp_path: Path) -> None:
    """The pool of a captured graph lives until the last graph rebound from it is released: grace.reset()
    releases them all, and the memory goes back to what it was before the first call."""
    import grace

    torch.manual_seed(0)
    model = Layered().cuda().eval()
    x = torch.randn(128, 512, device="cuda")
    before = memory_window_base(x.device)  # garbage of earlier tests collected, no cuBLAS workspace
    compiled = torch.compile(model, backend=GraceBackend(GraceOptions(cache_dir=str(tmp_path), scg=False)))
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
    torch.cuda.synchronize()
    assert any(r["rebinds"] for r in stats.snapshot())
    held = torch.cuda.memory_allocated()
    grace.reset()
    after = memory_window_base(x.device)
    _save("rebind_reset", {"before": before, "held": held, "after_reset": after})
    assert after <= before < held
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOL)  # starts over after a reset


def test_eight_layers_rebind_past_max_recaptures(tmp_path: Path) -> None:
    """Rebound graphs have their own bound (``max_rebinds``): the first piece of an eight-layer model keeps
    a graph per layer over one pool (7 rebinds, past ``max_recaptures`` = 3); the piece whose output the
    next layer reads is captured per layer and gives up past ``max_recaptures``, as before rebinding."""
    torch.manual_seed(0)
    model = Layered(depth=8).cuda().eval()
    compiled = torch.compile(model, backend=GraceBackend(GraceOptions(cache_dir=str(tmp_path), scg=False)))
    with torch.no_grad():
        x = torch.randn(128, 512, device="cuda")
        for call in range(4):
            torch.testing.assert_close(compiled(x), model(x), **TOL, msg=f"call {call}")
    records = stats.snapshot()
    _save("rebind_eight_layers", records)
    (first,) = [r for r in records if r["rebinds"]]
    assert (first["rebinds"], first["graphs_held"], first["variant"]) == (7, 8, "graph_pi"), first
    assert first["output_bytes_held"] == 128 * 2048 * 4, first
