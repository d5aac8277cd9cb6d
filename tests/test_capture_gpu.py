"""grace on a CUDA device: numerics equal eager for several models, also after inputs move to new
addresses and after a shape change; one graph launch per call where captured; driver-level graph
access; PI seam wiring; memory released on reset. All tests carry the ``gpu`` marker."""

from __future__ import annotations

import json
import os
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import grace
from grace import stats
from grace.backend import GraceBackend
from grace.options import GraceOptions
from grace.pi_contract import PlanDefaults

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_grace")]

TOL = {"rtol": 2e-3, "atol": 2e-3}


def _options(tmp_path: Path, **changes: Any) -> GraceOptions:
    values: dict[str, Any] = {"cache_dir": str(tmp_path), "scg_samples": 5, "scg_warmup": 1}
    values.update(changes)
    return GraceOptions(**values)


def _save_artifact(name: str, payload: Any) -> None:
    """Keep evidence (stats snapshots) when ``GRACE_TEST_ARTIFACTS`` names a directory."""
    directory = os.environ.get("GRACE_TEST_ARTIFACTS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"{name}.json").write_text(json.dumps(payload, indent=1, default=str))


# --- models ------------------------------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self, width: int = 256, depth: int = 4) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(inplace=True),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(inplace=True),
            torch.nn.AdaptiveAvgPool2d(1),
        )
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class LinearsWithCpuScalars(torch.nn.Module):
    """8 x Linear(256), each output scaled by a 0-d CPU tensor attribute (DESIGN 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(8))
        self.scales = [torch.tensor(0.5 + i / 16) for i in range(8)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, scale in zip(self.layers, self.scales, strict=True):
            x = torch.relu(layer(x)) * scale
        return x


def _xlnet() -> tuple[torch.nn.Module, Callable[[int], tuple[Any, ...]]]:
    from transformers import XLNetConfig, XLNetLMHeadModel

    config = XLNetConfig(vocab_size=1000, d_model=128, n_layer=2, n_head=4, d_inner=256)
    model = XLNetLMHeadModel(config)

    def inputs(seq: int) -> tuple[Any, ...]:
        return (torch.randint(0, 1000, (1, seq), device="cuda"),)

    return model, inputs


def _deberta() -> tuple[torch.nn.Module, Callable[[int], tuple[Any, ...]]]:
    from transformers import DebertaV2Config, DebertaV2ForQuestionAnswering

    config = DebertaV2Config(
        vocab_size=1000,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=256,
    )
    model = DebertaV2ForQuestionAnswering(config)

    def inputs(seq: int) -> tuple[Any, ...]:
        return (torch.randint(0, 1000, (1, seq), device="cuda"),)

    return model, inputs


def _factory(name: str) -> tuple[torch.nn.Module, Callable[[int], tuple[Any, ...]]]:
    if name == "mlp":
        return MLP(), lambda n: (torch.randn(n, 256, device="cuda"),)
    if name == "cnn":
        return CNN(), lambda n: (torch.randn(n, 3, 32, 32, device="cuda"),)
    if name == "linears_cpu_scalar":
        return LinearsWithCpuScalars(), lambda n: (torch.randn(n, 256, device="cuda"),)
    if name == "xlnet":
        return _xlnet()
    if name == "deberta":
        return _deberta()
    raise KeyError(name)


_SIZES = {
    "mlp": (16, 24),
    "cnn": (8, 4),
    "linears_cpu_scalar": (16, 8),
    "xlnet": (64, 48),
    "deberta": (64, 48),
}


def _to_cuda(model: torch.nn.Module) -> torch.nn.Module:
    model = model.cuda().eval()
    if isinstance(model, LinearsWithCpuScalars):
        model.scales = [s.clone() for s in model.scales]  # plain attributes stay on the CPU
    return model


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    return []


def _assert_same(got: Any, want: Any) -> None:
    got_t, want_t = _tensors(got), _tensors(want)
    assert len(got_t) == len(want_t) and got_t
    for g, w in zip(got_t, want_t, strict=True):
        torch.testing.assert_close(g, w, **TOL)


def _check_model(name: str, options: GraceOptions) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model_cpu, make_inputs = _factory(name)
    model = _to_cuda(model_cpu)
    compiled = torch.compile(model, backend=GraceBackend(options))
    first, second = _SIZES[name]
    with torch.no_grad():
        inputs = make_inputs(first)
        for _ in range(4):  # warm-up, deciding call, steady calls
            _assert_same(compiled(*inputs), model(*inputs))
        moved = tuple(t.clone() for t in inputs)  # same values, new addresses
        _assert_same(compiled(*moved), model(*moved))
        fresh = make_inputs(first)  # new values, new addresses
        _assert_same(compiled(*fresh), model(*fresh))
        stats.reset()
        steady_calls = 3
        for _ in range(steady_calls):
            _assert_same(compiled(*fresh), model(*fresh))
        snapshot = stats.snapshot()
        for record in snapshot:
            if record["variant"] in ("graph_copies", "graph_pi") and record["calls"]:
                assert record["graph_launches"] == record["calls"], record
                assert record["kernel_nodes"] is None or record["kernel_nodes"] > 0
        other = make_inputs(second)  # shape change
        for _ in range(3):
            _assert_same(compiled(*other), model(*other))
        _assert_same(compiled(*fresh), model(*fresh))  # back to the first shape
    return snapshot


@pytest.mark.parametrize("name", ["mlp", "cnn", "linears_cpu_scalar", "xlnet", "deberta"])
def test_numerics_equal_eager_with_graphs_kept(name: str, tmp_path: Path) -> None:
    snapshot = _check_model(name, _options(tmp_path, scg=False))
    _save_artifact(f"stats_kept_{name}", snapshot)
    variants = {r["variant"] for r in snapshot}
    if name in ("mlp", "cnn"):
        assert variants & {"graph_copies", "graph_pi"}, snapshot
    if name == "linears_cpu_scalar" and grace.available_techniques()["cgct"] is not None:
        reasons = {r["code"] for s in snapshot for r in s["skip_reasons"]}
        assert reasons & {"cpu_input", "cpu_op"}, snapshot


@pytest.mark.parametrize("name", ["mlp", "xlnet"])
def test_numerics_equal_eager_with_scg(name: str, tmp_path: Path) -> None:
    snapshot = _check_model(name, _options(tmp_path))
    _save_artifact(f"stats_scg_{name}", snapshot)
    assert any(r["decision"] is not None for r in snapshot)


def test_mlp_graph_gives_one_launch_per_call(tmp_path: Path) -> None:
    model = MLP().cuda().eval()  # the copies variant: PI (which serves this input in cuBLAS) is off
    compiled = torch.compile(model, backend=GraceBackend(_options(tmp_path, scg=False, pi=False)))
    x = torch.randn(8, 256, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        stats.reset()
        for _ in range(5):
            compiled(x)
    (record,) = stats.snapshot()
    assert record["variant"] == "graph_copies"
    assert record["graph_launches"] == 5 and record["calls"] == 5
    assert record["copy_bytes_per_replay"] == x.nbytes
    assert record["kernel_nodes"] is None or record["kernel_nodes"] >= 4


def test_elementwise_large_input_scg_picks_no_graph(tmp_path: Path) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x * 1.5 + 0.25)

    x = torch.randn(64, 1 << 20, device="cuda")
    compiled = torch.compile(f, backend=GraceBackend(_options(tmp_path, pi=False, scg_samples=9)))
    for _ in range(3):
        torch.testing.assert_close(compiled(x), f(x))
    (record,) = stats.snapshot()
    decision = record["decision"]
    assert decision["source"] == "profiled"
    assert record["variant"] == "no_graph", decision
    assert decision["medians_ms"]["graph_copies"] > decision["medians_ms"]["no_graph"]
    # a second process would read the decision back: same key, same answer, no timing
    torch._dynamo.reset()
    grace.reset()
    stats.forget_all()
    compiled = torch.compile(f, backend=GraceBackend(_options(tmp_path, pi=False, scg_samples=9)))
    for _ in range(3):
        compiled(x)
    (record,) = stats.snapshot()
    assert record["decision"]["source"] == "cache"
    assert record["variant"] == "no_graph"


def test_outputs_are_overwritten_unless_cloned(tmp_path: Path) -> None:
    model = MLP(depth=1).cuda().eval()
    a, b = torch.randn(4, 256, device="cuda"), torch.randn(4, 256, device="cuda")
    with torch.no_grad():
        kept = torch.compile(model, backend=GraceBackend(_options(tmp_path, scg=False)))
        for _ in range(3):
            kept(a)
        out_a = kept(a)
        kept(b)
        torch.testing.assert_close(out_a, model(b), **TOL)  # documented: the next replay overwrote it
        torch._dynamo.reset()
        cloned = torch.compile(model, backend=GraceBackend(_options(tmp_path, scg=False, clone_outputs=True)))
        for _ in range(3):
            cloned(a)
        out_a = cloned(a)
        cloned(b)
        torch.testing.assert_close(out_a, model(a), **TOL)


def _layer(x: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x) * 2.0 + 1.0
    torch._dynamo.graph_break()  # the code after it is one compiled piece, run once per layer
    return torch.relu(y) * 0.5


def _four_layers(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    a = _layer(x)
    b = _layer(a)
    c = _layer(b)
    return a, b, c, _layer(c)


@pytest.mark.parametrize("output_sets", [1, 16])
def test_outputs_held_within_one_call_are_never_overwritten(tmp_path: Path, output_sets: int) -> None:
    """Note: [Outputs held within one call] (grace.capture): each piece of ``_layer`` is one graph
    replayed once per layer, and the model returns every layer's result; a replay that overwrote an
    earlier layer's output would make them all equal to the last. With one set of outputs the held calls
    run without the graph; with more (Note: [Output sets] in grace.outputsets) they replay captures of their
    own."""
    x = torch.randn(64, 256, device="cuda")
    want = _four_layers(x)
    options = _options(tmp_path, scg=False, max_output_sets=output_sets)
    compiled = torch.compile(_four_layers, backend=GraceBackend(options))
    with torch.no_grad():
        for call in range(5):
            got = compiled(x)
            for layer, (g, w) in enumerate(zip(got, want, strict=True)):
                torch.testing.assert_close(g, w, **TOL, msg=f"call {call}, layer {layer}")
            del got
    records = grace.stats.snapshot()
    _save_artifact(f"outputs_held_within_one_call_{output_sets}", records)
    graphs = [r for r in records if r["variant"] in ("graph_pi", "graph_copies")]
    assert graphs, records
    # each graph's pool holds its one 64x256 float32 output
    assert all(r["output_bytes_held"] == r["graphs_held"] * x.nbytes for r in graphs), graphs
    if output_sets == 1:
        assert all(r["graphs_held"] == 1 for r in graphs), graphs
        assert any(r["held_output_calls"] > 0 for r in records), records
        assert "outputs_held" in {s["code"] for r in records for s in r["skip_reasons"]}
    else:
        assert any(r["graphs_held"] > 1 for r in graphs), graphs


def test_input_mutation_applies_once_and_aliases_follow_inputs(tmp_path: Path) -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x.add_(1)
        return x * y, y.view(-1)

    compiled = torch.compile(f, backend=GraceBackend(_options(tmp_path, scg=False)))
    y = torch.randn(4, 4, device="cuda")
    for _ in range(5):
        x = torch.randn(4, 4, device="cuda")
        x_ref = x.clone()
        out, view = compiled(x, y)
        torch.testing.assert_close(x, x_ref + 1)
        torch.testing.assert_close(out, (x_ref + 1) * y)
        assert view.data_ptr() == y.data_ptr()
    (record,) = stats.snapshot()
    # scg=False keeps the graph: with PI usable the mutated input is served through the pointer table
    # (the kernel writes the caller's tensor), else by copies in and out of the placeholder.
    expected = "graph_pi" if grace.available_techniques()["pi"] is None else "graph_copies"
    assert record["variant"] == expected, record


def test_parameter_moved_recaptures(tmp_path: Path) -> None:
    model = MLP(depth=1).cuda().eval()
    compiled = torch.compile(model, backend=GraceBackend(_options(tmp_path, scg=False)))
    x = torch.randn(4, 256, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        layer = model.net[0]
        layer.weight.data = layer.weight.data.clone() * 2  # new address, new values
        torch.testing.assert_close(compiled(x), model(x), **TOL)
        torch.testing.assert_close(compiled(x), model(x), **TOL)
    snapshot = stats.snapshot()
    # either Dynamo recompiled (a second record) or grace noticed the move and followed it (grace.rebind
    # edits a copy of the graph, or a capture)
    assert len(snapshot) > 1 or any(r["recaptures"] + r["rebinds"] >= 1 for r in snapshot), snapshot


def test_reset_releases_graph_memory(tmp_path: Path) -> None:
    model = MLP(width=1024).cuda().eval()
    compiled = torch.compile(model, backend=GraceBackend(_options(tmp_path, scg=False)))
    x = torch.randn(256, 1024, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    grace.reset()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() < held
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOL)  # starts over after a reset


def test_driver_level_graph_access() -> None:
    from grace.compat import cuda as cuda_compat
    from grace.compat import torch as torch_compat
    from grace.cudagraph import graph_summary, kernel_nodes

    if cuda_compat.driver() is None:
        pytest.skip(f"cuda-bindings missing: {cuda_compat.import_error()}")

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a @ b) + 1

    compiled = torch.compile(f, backend="inductor")
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    compiled(a, b)
    seen: dict[str, Any] = {}

    def hook(handle: int, placeholders: Any) -> None:
        seen["summary"] = graph_summary(handle)
        seen["kernels"] = kernel_nodes(handle)

    from grace.capture import capture_graph, run_on_side_stream

    run_on_side_stream(compiled, [a, b], a.device)  # per-stream state (cuBLAS workspace) before capture
    captured = capture_graph(
        compiled,
        [a, b],
        device=a.device,
        dynamic_indices=[0, 1],
        static_indices=[],
        mutated_indices=[],
        hooks=[hook],
    )
    try:
        assert seen["summary"].kernel_nodes >= 2
        kernels = seen["kernels"]
        assert all(k.grid[0] >= 1 for k in kernels)
        names = [k.name or "" for k in kernels]
        assert any("triton" in n for n in names), names
        if cuda_compat.has_param_info():
            triton_node = next(k for k in kernels if "triton" in (k.name or ""))
            pointers = {p.as_pointer() for p in triton_node.params}
            out_ptrs = {t.data_ptr() for t in captured.outputs if isinstance(t, torch.Tensor)}
            assert pointers & out_ptrs or pointers & {p.data_ptr() for p in captured.placeholders.values()}
        assert torch_compat.has_keep_graph() == hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph")
        out = captured.run_with_copies([a, b], clone=False)
        torch.testing.assert_close(out, f(a, b), **TOL)
    finally:
        captured.release()


class _FakePlan(PlanDefaults):
    """A PI plan that never covers anything: the runner must copy every input (seam wiring check)."""

    def __init__(self, dynamic: Sequence[int]) -> None:
        self.dynamic = tuple(dynamic)
        self.updates = 0

    @property
    def uncovered_indices(self) -> tuple[int, ...]:
        return self.dynamic

    @property
    def bytes_per_replay(self) -> int:
        return 0

    @property
    def stages(self) -> list[tuple[str, str, str]]:
        return [("rewrite", "skip", "fake plan")]

    def update(self, inputs: Sequence[Any]) -> bool:
        self.updates += 1
        return True


def test_pi_seam_receives_context_and_plan_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from grace.capture import CaptureContext

    contexts: list[CaptureContext] = []
    plans: list[_FakePlan] = []

    def prepare(ctx: CaptureContext) -> _FakePlan:
        contexts.append(ctx)
        plans.append(_FakePlan(ctx.dynamic_input_indices))
        return plans[-1]

    fake = types.ModuleType("grace.pi")
    fake.prepare = prepare  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "grace.pi", fake)
    model = MLP(depth=2).cuda().eval()
    # The two-variant path (placeholders): under pi_direct a plan that covers nothing is declined
    # first, so prepare runs twice (tests/test_decide.py covers that path).
    options = _options(tmp_path, scg=False, pi_direct=False)
    compiled = torch.compile(model, backend=GraceBackend(options))
    x = torch.randn(8, 256, device="cuda")
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    from grace.compat import cuda as cuda_compat

    if cuda_compat.driver() is None:
        assert not contexts
        return
    (ctx,) = contexts
    assert ctx.graph_handle != 0
    assert set(ctx.placeholders) == set(ctx.dynamic_input_indices) and ctx.dynamic_input_indices
    assert ctx.device.type == "cuda"
    (record,) = stats.snapshot()
    assert record["variant"] == "graph_pi"
    assert plans[0].updates >= 2
    assert record["pi_stages"] == [["rewrite", "skip", "fake plan"]]
