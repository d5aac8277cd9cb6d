"""The grace backend on CPU: registration, options, fallback without CUDA, seams, reset, LRU."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import grace
from grace import stats
from grace.backend import GraceBackend, grace_backend
from grace.options import GraceOptions, GraceOptionsError
from grace.reasons import SkipCode


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    stats.forget_all()
    yield
    torch._dynamo.reset()
    stats.forget_all()


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * 2


def test_backend_is_registered_by_name() -> None:
    from torch._dynamo.backends.registry import list_backends, lookup_backend

    assert lookup_backend("grace") is grace_backend
    assert "grace" in list_backends()
    assert callable(getattr(grace_backend, "reset", None))


def test_entry_point_target_is_the_registered_backend() -> None:
    import importlib

    module_name, _, attr = "grace.backend:grace_backend".partition(":")
    assert getattr(importlib.import_module(module_name), attr) is grace_backend


def test_without_cuda_inductor_runs_alone_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from grace.compat import torch as torch_compat

    monkeypatch.setattr(torch_compat, "cuda_available", lambda: False)
    model = Small()
    x = torch.randn(4, 8)
    compiled = torch.compile(model, backend="grace", options={"scg_samples": 5})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        torch.testing.assert_close(compiled(x + 1), model(x + 1))
    (record,) = stats.snapshot()
    assert record["variant"] == "no_graph"
    assert record["calls"] == 2
    assert record["graph_launches"] == 0
    codes = {r["code"] for r in record["skip_reasons"]}
    assert codes & {SkipCode.NO_CUDA.value, SkipCode.CPU_INPUT.value}
    if not torch.cuda.is_available():
        assert SkipCode.NO_CUDA.value in codes


def test_options_reach_the_backend_and_bad_ones_fail() -> None:
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(GraceOptionsError, match="unknown grace option"):
        grace_backend(gm, [torch.randn(2)], options={"nope": 1})
    with pytest.raises(GraceOptionsError, match="no mode"):
        grace_backend(gm, [torch.randn(2)], mode="reduce-overhead")
    with pytest.raises(GraceOptionsError, match="GraceBackend"):
        GraceBackend()(gm, [torch.randn(2)], options={"pi": False})
    assert GraceBackend(GraceOptions(pi=False)) == GraceBackend({"pi": False})  # type: ignore[arg-type]


def test_grace_compile_rejects_torch_compile_backend_arguments() -> None:
    with pytest.raises(GraceOptionsError, match="backend"):
        grace.compile(Small(), backend="inductor")
    compiled = grace.compile(Small(), GraceOptions(cuda_graphs=False), dynamic=False)
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), compiled._orig_mod(x))


def test_available_techniques_keys_and_reasons() -> None:
    techniques = grace.available_techniques()
    assert set(techniques) == {"runtime", "cgct", "pi", "scg"}
    if not torch.cuda.is_available():
        assert techniques["runtime"] == "no CUDA device"
        assert techniques["scg"] == "no CUDA device"
    for value in techniques.values():
        assert value is None or (isinstance(value, str) and value)


def test_dynamo_reset_releases_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    import grace.runner

    calls: list[int] = []
    monkeypatch.setattr(grace.runner, "release_all", lambda: calls.append(1) or 0)
    compiled = torch.compile(Small(), backend="grace")
    with torch.no_grad():
        compiled(torch.randn(2, 8))
    torch._dynamo.reset()
    assert calls, "torch._dynamo.reset() did not reach grace"


@dataclass
class _FakeResult:
    gm: torch.fx.GraphModule
    example_inputs: list[Any]
    input_adapter: Any
    diagnoses: list[Any] = field(default_factory=list)


def test_cgct_seam_transform_and_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"transform": 0, "adapter": 0}

    class Adapter:  # grace.adapting.InputAdapting
        def __call__(self, args: list[Any]) -> list[Any]:
            calls["adapter"] += 1
            return args

        def returned(self, outputs: Any) -> None:
            pass

    adapter = Adapter()

    def transform(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> _FakeResult:
        calls["transform"] += 1
        return _FakeResult(gm, example_inputs, adapter, diagnoses=["diag"])

    fake = types.ModuleType("grace.cgct")
    fake.transform = transform  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "grace.cgct", fake)
    model = Small()
    compiled = torch.compile(model, backend="grace")
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        compiled(x)
    assert calls["transform"] == 1
    assert calls["adapter"] == 2


def test_cgct_failure_is_recorded_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("grace.cgct")

    def transform(gm: Any, inputs: Any) -> Any:
        raise ValueError("boom")

    fake.transform = transform  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "grace.cgct", fake)
    model = Small()
    x = torch.randn(2, 8)
    with torch.no_grad():
        report = grace.explain(model, x)
    notes = [n for g in report.graphs for n in g.notes]
    assert any("cgct_failed" in n and "boom" in n for n in notes), notes
    assert "graph" in str(report)


def test_explain_compiles_its_own_graphs_beside_an_equal_compile() -> None:
    """A second instance of a class passes the guards of the first one's Dynamo entry; explain must
    still compile (and report) its own graph instead of running through the user's runner."""
    import copy

    model = Small()
    x = torch.randn(2, 8)
    compiled = grace.compile(model, options=GraceOptions())
    with torch.no_grad():
        compiled(x)
        user_ids = {r["callable_id"] for r in stats.snapshot()}
        user_calls = {r["callable_id"]: r["calls"] for r in stats.snapshot()}
        report = grace.explain(copy.deepcopy(model), x)
    assert len(report.graphs) == 1, str(report)
    assert report.graphs[0].callable_id not in user_ids
    after = {r["callable_id"]: r["calls"] for r in stats.snapshot() if r["callable_id"] in user_ids}
    assert after == user_calls  # explain's calls ran through its own runner only


def test_missing_seams_give_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    from grace.seams import load_seam

    monkeypatch.setitem(sys.modules, "grace.pi", None)  # import fails
    module, reason = load_seam("pi", "prepare")
    assert module is None and reason is not None
    assert reason.code is SkipCode.PI_UNAVAILABLE
    assert reason.detail.startswith("grace.pi not available")


def test_explain_reports_each_graph() -> None:
    model = Small()
    with torch.no_grad():
        report = grace.explain(model, torch.randn(2, 8))
    assert len(report.graphs) == 1
    text = str(report)
    assert "compiled graph" in text and "variant no_graph" in text
    assert isinstance(report.diagnoses, list)
