"""The backend never raises for its own failures (Note: [The backend never raises for its own failures]
in grace.backend): failures injected into grace's compile path and run path give the no-graph result
with a recorded reason; a model's own error still raises; a call that ran a mutating callable is never
run twice. CPU only (Inductor without CUDA)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from grace import backend, stats
from grace.compat import dynamo as dynamo_compat
from grace.compat import torch as torch_compat
from grace.reasons import SkipCode
from grace.runner import GraceRunner


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


def _codes() -> set[str]:
    return {r["code"] for record in stats.snapshot() for r in record["skip_reasons"]}


def _check_calls(compiled: Any, model: torch.nn.Module, calls: int = 3) -> None:
    for i in range(calls):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)


def test_analysis_failure_compiles_without_graphs_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("injected analysis failure")

    monkeypatch.setattr(backend, "analyze_inputs", broken)
    model = Small()
    _check_calls(torch.compile(model, backend="grace"), model)
    assert SkipCode.BACKEND_FAILED.value in _codes()
    assert stats.fallback_counts()[SkipCode.BACKEND_FAILED.value] == 1


@dataclass
class _Transformed:
    gm: torch.fx.GraphModule
    example_inputs: list[Any]
    input_adapter: Any = None
    diagnoses: list[Any] = field(default_factory=list)


def _fake_cgct(monkeypatch: pytest.MonkeyPatch, adapter: Any = None) -> None:
    """A CGCT seam that returns a copy of the graph (marked) with ``adapter``."""

    def transform(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> _Transformed:
        clone = dynamo_compat.clone_graph_module(gm)
        clone._transformed_by_test = True  # type: ignore[assignment]
        return _Transformed(clone, list(example_inputs), adapter)

    fake = types.ModuleType("grace.cgct")
    fake.transform = transform  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "grace.cgct", fake)


def test_compile_failure_of_the_cgct_graph_compiles_dynamos_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """The crash of issue 18 (an IndexError while compiling the graph CGCT produced reached Dynamo as an
    InternalTorchDynamoError): Dynamo's own graph is compiled instead, with the reason."""
    _fake_cgct(monkeypatch)
    real_compile = torch_compat.compile_with_inductor
    compiled_graphs: list[bool] = []

    def compile_with_inductor(gm: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        transformed = bool(getattr(gm, "_transformed_by_test", False))
        compiled_graphs.append(transformed)
        if transformed:
            raise IndexError("list index out of range")
        return real_compile(gm, *args, **kwargs)

    monkeypatch.setattr(torch_compat, "compile_with_inductor", compile_with_inductor)
    sink = backend.collect_compiled_graphs()
    try:
        model = Small()
        _check_calls(torch.compile(model, backend="grace"), model)
    finally:
        backend.stop_collecting(sink)
    assert compiled_graphs == [True, False]
    (info,) = sink
    assert not info.cgct_transformed
    assert info.cgct_note is not None and info.cgct_note.code is SkipCode.CGCT_FAILED
    assert "IndexError" in info.cgct_note.detail


def test_runner_failure_takes_the_safe_path_from_then_on(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def broken(self: GraceRunner, args: Any) -> Any:
        calls.append(1)
        raise RuntimeError("injected runner failure")

    monkeypatch.setattr(GraceRunner, "run", broken)
    model = Small()
    _check_calls(torch.compile(model, backend="grace"), model, calls=3)
    assert calls == [1], "after the first failure every call takes the safe path"
    assert SkipCode.RUNNER_FAILED.value in _codes()
    assert stats.fallback_counts()[SkipCode.RUNNER_FAILED.value] == 1
    (failed,) = [r for r in stats.snapshot() if r["skip_reasons"][0]["code"] == "runner_failed"]
    assert failed["calls"] == 3 and failed["variant"] == "no_graph"


def test_adapter_failure_runs_dynamos_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    class Adapter:  # grace.adapting.InputAdapting
        def __call__(self, args: list[Any]) -> list[Any]:
            raise ValueError("injected adapter failure")

        def returned(self, outputs: Any) -> None:
            pass

    adapter = Adapter()

    _fake_cgct(monkeypatch, adapter)
    model = Small()
    _check_calls(torch.compile(model, backend="grace"), model)
    assert SkipCode.RUNNER_FAILED.value in _codes()


@torch.library.custom_op("grace_test::checked_double", mutates_args=())
def checked_double(x: torch.Tensor) -> torch.Tensor:
    if bool((x < 0).any()):
        raise ValueError("negative input")
    return x * 2


@checked_double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_a_models_own_error_still_raises() -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        return checked_double(x) + 1

    compiled = torch.compile(model, backend="grace")
    x = torch.ones(4)
    torch.testing.assert_close(compiled(x), model(x))
    with pytest.raises(ValueError, match="negative input"):
        compiled(-x)
    torch.testing.assert_close(compiled(x + 1), model(x + 1))
    assert SkipCode.RUNNER_FAILED.value not in _codes(), "the model's error is not grace's failure"


def test_a_call_that_ran_a_mutating_callable_is_not_run_again(monkeypatch: pytest.MonkeyPatch) -> None:
    real_run = GraceRunner.run

    def fails_after_running(self: GraceRunner, args: Any) -> Any:
        real_run(self, args)
        raise RuntimeError("injected failure after the run")

    monkeypatch.setattr(GraceRunner, "run", fails_after_running)

    def step(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2

    compiled = torch.compile(step, backend="grace")
    x = torch.zeros(4)
    with pytest.raises(RuntimeError, match="injected failure after the run"):
        compiled(x)
    assert torch.equal(x, torch.ones(4)), "the in-place update must be applied exactly once"
