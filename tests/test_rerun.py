"""Graphs that write their inputs or draw random numbers, through the backend on CPU with a fake capture.

The backend's own analysis (op schemas, grace.analysis) decides which inputs a graph writes; the
runner then decides, checks and verifies with fake graphs that replay the callable on what they read
(placeholders for dynamic inputs, the inputs themselves for static ones), as a CUDA graph would. Each
call is compared with eager: a callable that writes its inputs must leave them as one eager run per call
does, including under ``inference_mode`` (no version counters) and without warm-up calls, and one that
draws random numbers must return what eager draws after the same seed and leave the generator where
eager leaves it."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import fakes
import pytest
import torch

import grace.backend
import grace.choice
import grace.decide
import grace.runner
import grace.slot
import grace.variants
from grace import stats
from grace.analysis import InputAnalysis
from grace.backend import GraceBackend
from grace.compat import torch as torch_compat
from grace.options import GraceOptions
from grace.scg import Variant


@torch.library.custom_op("grace_rerun_test::scale", mutates_args=("x",))
def _scale_(x: torch.Tensor, factor: float) -> None:
    x.mul_(factor)


@_scale_.register_fake
def _scale_fake(x: torch.Tensor, factor: float) -> None:
    return None


def fake_timing(
    runs: Mapping[Variant, Callable[[], Any]], *, samples: int, **_: Any
) -> dict[Variant, list[float]]:
    """SCG's samples without CUDA events: every run is made (as the real timing makes them), the graph
    variants are the fastest."""
    for _round in range(samples):
        for run in runs.values():
            run()
    return {v: [2.0 if v == Variant.NO_GRAPH else 1.0] * samples for v in runs}


def _cpu_analysis(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> InputAnalysis:
    """What grace.analysis would say of these inputs on a CUDA device: parameters static."""
    tensors = [i for i, v in enumerate(example_inputs) if isinstance(v, torch.Tensor)]
    static = tuple(i for i in tensors if isinstance(example_inputs[i], torch.nn.Parameter))
    dynamic = tuple(i for i in tensors if i not in static)
    scalars = tuple(i for i, v in enumerate(example_inputs) if isinstance(v, (int, float)))
    return InputAnalysis(static, dynamic, scalars, torch.device("cpu"), None)


@pytest.fixture(autouse=True)
def fake_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The backend as on a CUDA device, with Inductor left out (the FX graph is the compiled callable)."""
    monkeypatch.setattr(grace.backend, "analyze_inputs", _cpu_analysis)
    monkeypatch.setattr(torch_compat, "cuda_available", lambda: True)
    monkeypatch.setattr(torch_compat, "compile_with_inductor", lambda gm, inputs, record, **_: gm.forward)
    monkeypatch.setattr(grace.backend, "_environment", lambda device: None)
    monkeypatch.setattr(grace.variants, "capture_graph", fakes.fake_capture)
    monkeypatch.setattr(grace.choice, "time_variants", fake_timing)
    monkeypatch.setattr(grace.slot, "run_on_side_stream", lambda fn, args, device: fn(*args))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    counter = itertools.count(1)
    monkeypatch.setattr(grace.slot.torch_compat, "compiled_call_generation", lambda: next(counter))
    torch._dynamo.reset()
    stats.forget_all()
    yield
    torch._dynamo.reset()
    stats.forget_all()


def _options(**values: Any) -> GraceOptions:
    base: dict[str, Any] = {"cgct": False, "pi": False, "persist_decisions": False, "scg_samples": 3}
    base.update(values)
    return GraceOptions(**base)


def foreach_step(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    torch._foreach_add_([a, b], [c, c])
    return a * 2 + b


def custom_op_step(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    torch.ops.grace_rerun_test.scale(a, 1.5)
    return a + b * c


def optimizer_step(p0: torch.Tensor, p1: torch.Tensor, g0: torch.Tensor, g1: torch.Tensor) -> None:
    torch._foreach_mul_([p0, p1], 0.9)
    torch._foreach_add_([p0, p1], [g0, g1], alpha=-0.1)


GRAD_MODES: dict[str, Callable[[], Any]] = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}


def _inputs(count: int, parameters: bool = False) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    values = [torch.randn(8, dtype=torch.float64, generator=generator) for _ in range(count)]
    if parameters:
        values[:2] = [torch.nn.Parameter(v, requires_grad=False) for v in values[:2]]
    return values


def _compare_calls(fn: Callable[..., Any], options: GraceOptions, mode: str, calls: int, **kw: Any) -> None:
    """``calls`` calls of ``fn`` compiled with grace and of eager ``fn``, on their own copies of the
    same inputs: every output and every input equal after every call."""
    with GRAD_MODES[mode]():
        ours = _inputs(kw.get("count", 3), kw.get("parameters", False))
        theirs = [t.detach().clone() for t in ours]
        compiled = torch.compile(fn, backend=GraceBackend(options))
        for call in range(calls):
            got = compiled(*ours)
            expected = fn(*theirs)
            if expected is not None:
                torch.testing.assert_close(got, expected, rtol=0, atol=1e-12, msg=f"output of call {call}")
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=f"input {i} after call {call}")


@pytest.mark.parametrize("mode", list(GRAD_MODES))
@pytest.mark.parametrize("warmup_calls", [0, 1])
@pytest.mark.parametrize("fn", [foreach_step, custom_op_step], ids=lambda f: f.__name__)
def test_a_mutating_graph_applies_its_writes_once_per_call(fn: Any, warmup_calls: int, mode: str) -> None:
    _compare_calls(fn, _options(warmup_calls=warmup_calls), mode, calls=5)
    records = stats.snapshot()
    assert records and all(r["variant"] == Variant.GRAPH_COPIES.value for r in records), records


@pytest.mark.parametrize("scg", [True, False])
def test_an_optimizer_like_step_on_static_parameters_equals_eager_call_after_call(scg: bool) -> None:
    """Parameters are used in place by the graph (static inputs), so every extra run writes them."""
    _compare_calls(
        optimizer_step, _options(warmup_calls=0, scg=scg), "inference_mode", 6, count=4, parameters=True
    )


def test_every_run_of_a_mutating_graph_starts_from_the_callers_values() -> None:
    """Deciding call (reference, check), verified replays: each run sees what the caller passed."""
    seen: list[tuple[int, float]] = []
    call = [0]

    def step(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        torch._foreach_add_([a], [b])
        return a * 1

    original = grace.runner.GraceRunner.__init__

    def recording_init(self: Any, compiled: Any, *args: Any, **kwargs: Any) -> None:
        def counted(*inputs: Any) -> Any:
            seen.append((call[0], float(inputs[0][0])))  # graph replays and no-graph runs alike
            return compiled(*inputs)

        original(self, counted, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grace.runner.GraceRunner, "__init__", recording_init)
        with torch.inference_mode():
            a, b = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
            compiled = torch.compile(step, backend=GraceBackend(_options(warmup_calls=0)))
            for call[0] in range(4):
                assert compiled(a, b).tolist() == [call[0] + 1.0] * 2
                assert a.tolist() == [call[0] + 1.0] * 2
    assert len({c for c, _ in seen}) == 4
    assert len(seen) > 4  # the deciding call and the verified calls ran more than once
    assert all(value == c for c, value in seen), seen


def noisy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * 2 + torch.rand_like(b)


def dropout_training(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(a + b, 0.5, training=True)


@pytest.mark.parametrize("options", [{"scg": True}, {"scg": False}, {"warmup_calls": 0}], ids=str)
@pytest.mark.parametrize("fn", [noisy, dropout_training], ids=lambda f: f.__name__)
def test_random_draws_and_the_generator_equal_eager_after_the_same_seed(fn: Any, options: Any) -> None:
    calls = 5
    with torch.no_grad():
        ours = _inputs(2)
        compiled = torch.compile(fn, backend=GraceBackend(_options(**options)))
        torch.manual_seed(0)
        got = [compiled(*ours).clone() for _ in range(calls)]
        state = torch.get_rng_state()
        torch.manual_seed(0)
        expected = [fn(*ours) for _ in range(calls)]
    for call, (g, e) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12, msg=f"call {call}")
    assert torch.equal(state, torch.get_rng_state()), "the generator is not where eager leaves it"
    records = stats.snapshot()
    assert all(r["variant"] == Variant.GRAPH_COPIES.value for r in records if r["calls"]), records


def through_a_view(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    a.view(-1)[:2].copy_(b[:2])
    return b + c


def out_variant(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    product = a * b  # inputs first used in the order a, b, c (Dynamo orders them so)
    torch.add(b, 1, out=c)
    return product


@pytest.mark.parametrize(
    "fn,written",
    [(foreach_step, {"a", "b"}), (custom_op_step, {"a"}), (through_a_view, {"a"}), (out_variant, {"c"})],
    ids=lambda v: getattr(v, "__name__", None) or "-".join(sorted(map(str, v))),
)
def test_the_backend_publishes_the_inputs_each_graph_writes(fn: Any, written: set[str]) -> None:
    from grace.backend import collect_compiled_graphs, stop_collecting

    sink = collect_compiled_graphs()
    try:
        with torch.inference_mode():
            torch.compile(fn, backend=GraceBackend(_options()))(*_inputs(3))
    finally:
        stop_collecting(sink)
    assert len(sink) == 1
    assert {"abc"[i] for i in sink[0].mutated_inputs} == written


@pytest.mark.parametrize("fn", [foreach_step, optimizer_step], ids=lambda f: f.__name__)
@pytest.mark.parametrize("mode", list(GRAD_MODES))
@pytest.mark.parametrize("host_reference_bytes", [0, 4 << 20])
def test_a_write_the_analysis_missed_ends_the_deciding_call_after_its_first_run(
    monkeypatch: pytest.MonkeyPatch, host_reference_bytes: int, mode: str, fn: Any
) -> None:
    """The deciding call's first run shows a write the analysis did not report: that run is the call.
    Seen by the input's version counter, the next call decides with the write known; seen by its
    contents alone (inference_mode: no counters), the slot keeps no graph, and a callable that returns
    nothing (an optimizer step) is not run a second time for its output."""
    from grace.analysis import GraphEffects

    monkeypatch.setattr(grace.backend, "graph_effects", lambda gm, inputs: GraphEffects((), ()))
    options = _options(warmup_calls=0, host_reference_bytes=host_reference_bytes)
    _compare_calls(fn, options, mode, calls=5, count=4 if fn is optimizer_step else 3)
    records = stats.snapshot()
    kept = Variant.GRAPH_COPIES if mode == "no_grad" else Variant.NO_GRAPH
    assert records and all(r["variant"] == kept.value for r in records), records
    assert any(r["code"] == "unlisted_write" for r in records[0]["skip_reasons"]), records


def test_contents_show_writes_no_version_counter_records() -> None:
    """A kernel writing through a raw pointer bumps no version counter (``.data`` stands in for one)."""
    from grace.rerun import CallStart, UnlistedWrites

    args = [torch.arange(6.0), torch.ones(3, dtype=torch.bool), torch.zeros(5, dtype=torch.int8), 3]
    start = CallStart(args, mutated=[2], random=False, device=None, fingerprints=True)
    assert not start.unexpected_writes()
    args[0].data[4] = 7.0
    args[1].data[0] = False
    args[2].data.fill_(1)  # listed as written: not unexpected
    assert start.unexpected_writes() == UnlistedWrites(counted=(), unseen=(0, 1))
    args[1].mul_(True)  # a counted write (of the same values): counted, and no longer "unseen"
    assert start.unexpected_writes() == UnlistedWrites(counted=(1,), unseen=(0,))
    base = torch.zeros(4)
    views = [base, base[1:]]
    aliased = CallStart(views, mutated=[0], random=False, device=None, fingerprints=True)
    base.data[2] = 1.0
    assert not aliased.unexpected_writes()  # a view of a listed written input: explained by that write
    blind = CallStart(args, mutated=[], random=False, device=None)
    args[0].data[0] = 5.0
    assert not blind.unexpected_writes()  # without fingerprints only the counters tell
