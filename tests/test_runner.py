"""GraceRunner on CPU: signatures, LRU bound, release and skip mode. The CUDA-only steps (side-stream
warm-up, deciding call) are replaced by plain calls so that the bookkeeping can be checked here."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import fakes
import pytest
import torch
from fakes import SlotGraph

import grace.decide
import grace.runner
import grace.slot
from grace import stats
from grace.decide import SlotDecision
from grace.options import GraceOptions
from grace.reasons import SkipCode, SkipReason
from grace.runner import GraceRunner, RunnerPlan, describe_signature
from grace.scg import Variant


@pytest.fixture(autouse=True)
def cpu_runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    decided: list[int] = []

    def decide(facts: Any, args: Sequence[Any]) -> SlotDecision:
        decided.append(1)
        return fakes.decides_no_graph(facts, args)

    fakes.cpu_warmup(monkeypatch)
    fakes.use_decide(monkeypatch, decide)
    stats.forget_all()
    yield decided
    stats.forget_all()


def _runner(max_graphs: int = 2, skip: SkipReason | None = None) -> GraceRunner:
    plan = RunnerPlan(
        graph_hash="h",
        device=torch.device("cpu"),
        static_indices=(0,),
        dynamic_indices=(1,),
        scalar_indices=(2,),
        skip=skip,
    )
    return GraceRunner(
        lambda w, x, n: [x * w * n], plan, GraceOptions(max_graphs_per_callable=max_graphs), None
    )


def test_signature_covers_shape_stride_dtype_and_scalars() -> None:
    runner = _runner()
    w = torch.ones(())
    base = runner.signature((w, torch.ones(2, 3), 4))
    assert runner.signature((w, torch.ones(2, 3), 4)) == base
    assert runner.signature((w, torch.ones(3, 2), 4)) != base
    assert runner.signature((w, torch.ones(3, 2).t(), 4)) != base  # same shape, other strides
    assert runner.signature((w, torch.ones(2, 3, dtype=torch.float64), 4)) != base
    assert runner.signature((w, torch.ones(2, 3), 5)) != base
    assert describe_signature(base) == "float32[2, 3]/[3, 1];int=4"


def test_lru_bound_releases_the_oldest_slot(cpu_runner: list[int]) -> None:
    runner = _runner(max_graphs=2)
    w = torch.full((), 2.0)
    for rows in (1, 2, 1, 3):  # 1 is used again before 3 arrives, so 2 is evicted
        for _ in range(3):
            (out,) = runner(w, torch.ones(rows, 4), 3)
            torch.testing.assert_close(out, torch.full((rows, 4), 6.0))
    assert len(runner.slots) == 2
    records = {r["signature"]: r for r in stats.snapshot()}
    assert records["float32[2, 4]/[4, 1];int=3"]["released"] is True
    assert records["float32[1, 4]/[4, 1];int=3"]["released"] is False
    assert records["float32[1, 4]/[4, 1];int=3"]["calls"] == 6
    assert records["float32[3, 4]/[4, 1];int=3"]["variant"] == Variant.NO_GRAPH.value
    assert len(cpu_runner) == 3  # one deciding call per signature


def test_reset_releases_and_starts_over(cpu_runner: list[int]) -> None:
    runner = _runner()
    w = torch.ones(())
    for _ in range(3):
        runner(w, torch.ones(2, 2), 1)
    assert grace.runner.release_all() >= 1
    assert not runner.slots
    runner(w, torch.ones(2, 2), 1)
    assert len(runner.slots) == 1


def test_skip_mode_runs_the_compiled_callable_and_records_the_reason() -> None:
    runner = _runner(skip=SkipReason(SkipCode.CPU_INPUT, "input x is on cpu"))
    (out,) = runner(torch.ones(()), torch.ones(2), 2)
    torch.testing.assert_close(out, torch.full((2,), 2.0))
    (record,) = stats.snapshot()
    assert record["variant"] == "no_graph" and record["calls"] == 1
    assert record["skip_reasons"][0]["code"] == "cpu_input"
    assert not runner.slots


class _FakeGraph(SlotGraph):
    """A slot's graph that logs its capture, replays and release."""

    def __init__(self, args: Sequence[Any], static_indices: tuple[int, ...], log: list[str]) -> None:
        super().__init__(args, static_indices)
        self.name = f"g{sum(1 for e in log if e.startswith('capture'))}"
        self.log = log
        log.append(f"capture {self.name}")

    def run_with_copies(self, args: Sequence[Any], clone: bool) -> Any:
        self.log.append(f"replay {self.name}")
        return [args[1] * args[0] * args[2]]

    def release(self) -> None:
        self.log.append(f"release {self.name}")


def test_graphs_of_earlier_static_addresses_are_used_again(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []

    fakes.use_decide(
        monkeypatch, fakes.decides_graph(lambda facts, args: _FakeGraph(args, facts.plan.static_indices, log))
    )
    fakes.use_rebind(monkeypatch, fakes.no_rebind)  # tests/test_rebind.py
    runner = _runner()
    layers = [torch.full((), float(k + 1)) for k in range(5)]  # one callable, several layers' weights
    x = torch.ones(2, 3)
    for w in (layers[0], layers[0], layers[1], layers[0], layers[1], layers[2], layers[3]):
        (out,) = runner(w, x, 2)
        torch.testing.assert_close(out, x * w * 2)
    # one capture per address set; coming back to layer 0 or 1 replays its graph without a capture
    assert [e for e in log if e.startswith("capture")] == [
        "capture g0",
        "capture g1",
        "capture g2",
        "capture g3",
    ]
    assert log[-1] == "replay g3" and "release g0" not in log
    (record,) = [r for r in stats.snapshot() if r["callable_id"] == runner.callable_id]
    assert record["recaptures"] == 3 and record["variant"] == "graph_copies"
    (out,) = runner(layers[4], x, 2)  # a fourth re-capture is past max_recaptures (3): no graph at all
    torch.testing.assert_close(out, x * layers[4] * 2)
    assert sorted(e for e in log if e.startswith("release")) == [f"release g{k}" for k in range(4)]
    (record,) = [r for r in stats.snapshot() if r["callable_id"] == runner.callable_id]
    assert record["variant"] == "no_graph"
    assert "too_many_recaptures" in {s["code"] for s in record["skip_reasons"]}


# --- the recent-slot check ---------------------------------------------------------------------------


def test_this_torch_has_the_c_tensor_check() -> None:
    """The fast path is on for the torch the tests run on (it would silently cost the full signature)."""
    assert grace.compat.torch.has_tensor_metadata_check()


def _variants() -> list[tuple[Any, ...]]:
    w = torch.ones(())
    base = torch.ones(4, 6)
    return [
        (w, base, 3),
        (w, torch.zeros(4, 6), 3),  # same signature, other values and address
        (w, torch.ones(8, 6)[::2], 3),  # same shape, other strides
        (w, torch.ones(6, 4).t(), 3),  # same shape, transposed strides
        (w, torch.ones(4, 6, dtype=torch.float64), 3),
        (w, torch.ones(4, 6, 1), 3),
        (w, torch.ones(24)[:24].view(4, 6), 3),
        (w, torch.ones(30)[6:].view(4, 6), 3),  # a view with a storage offset: same signature
        (w, torch.ones(4, 6, requires_grad=True), 3),  # same signature, stricter check differs
        (w, base, 4),
        (w, base, 3.0),  # equal value, other type
        (w, base, True),
    ]


def test_a_recent_slot_match_implies_the_same_signature() -> None:
    runner = _runner()
    variants = _variants()
    signatures = [runner.signature(v) for v in variants]
    for i, first in enumerate(variants):
        recent = grace.runner._RecentSlot.build(runner.plan, first, object())  # type: ignore[arg-type]
        assert recent is not None and recent.matches(first)
        for j, other in enumerate(variants):
            if recent.matches(other):
                assert signatures[j] == signatures[i], (i, j)
            if signatures[j] != signatures[i]:
                assert not recent.matches(other), (i, j)
    # the cases the check must accept, or the fast path would never be taken
    recent = grace.runner._RecentSlot.build(runner.plan, variants[0], object())  # type: ignore[arg-type]
    assert recent is not None
    assert recent.matches(variants[1]) and recent.matches(variants[6]) and recent.matches(variants[7])


def test_repeated_signatures_skip_the_python_signature(
    cpu_runner: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = _runner(max_graphs=2)
    built: list[int] = []
    full = runner.signature

    def counting(args: Sequence[Any]) -> tuple[Any, ...]:
        built.append(1)
        return full(args)

    monkeypatch.setattr(runner, "signature", counting)
    w = torch.full((), 2.0)
    for _ in range(5):
        (out,) = runner(w, torch.ones(2, 4), 3)
        torch.testing.assert_close(out, torch.full((2, 4), 6.0))
    assert len(built) == 1
    (out,) = runner(w, torch.ones(3, 4), 3)  # a new shape goes down the full path to its own slot
    torch.testing.assert_close(out, torch.full((3, 4), 6.0))
    (out,) = runner(w, torch.ones(3, 4), 5)  # so does a new scalar
    torch.testing.assert_close(out, torch.full((3, 4), 10.0))
    assert len(built) == 3 and len(runner.slots) == 2
    calls = {r["signature"]: r["calls"] for r in stats.snapshot()}
    assert calls["float32[2, 4]/[4, 1];int=3"] == 5


def test_reset_and_eviction_forget_the_recent_slot(cpu_runner: list[int]) -> None:
    runner = _runner(max_graphs=1)
    w = torch.ones(())
    runner(w, torch.ones(2, 2), 1)
    first = runner._recent
    assert first is not None and first.slot in runner.slots.values()
    runner(w, torch.ones(3, 3), 1)  # evicts the first slot
    assert runner._recent is not None and runner._recent.slot is not first.slot
    assert runner._recent.slot in runner.slots.values()
    runner.reset()
    assert runner._recent is None and not runner.slots
    runner(w, torch.ones(3, 3), 1)
    assert len(runner.slots) == 1


def test_alternating_signatures_build_each_check_once(
    cpu_runner: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = _runner(max_graphs=2)
    built: list[int] = []
    real = grace.runner._RecentSlot.build

    def counting(*a: Any) -> Any:
        built.append(1)
        return real(*a)

    monkeypatch.setattr(grace.runner._RecentSlot, "build", counting)
    w = torch.ones(())
    for k in range(6):
        rows = 2 + k % 2
        (out,) = runner(w, torch.ones(rows, 4), 3)
        torch.testing.assert_close(out, torch.full((rows, 4), 3.0))
    assert len(built) == 2 and len(runner.slots) == 2


# --- Note: [Outputs held within one call] -----------------------------------------------------------


def _held_output_runner(
    monkeypatch: pytest.MonkeyPatch, generation: list[int], **options: Any
) -> tuple[GraceRunner, torch.Tensor]:
    """A runner whose slot decides for a real CapturedGraph (CPU tensors, one static output)."""
    placeholder = torch.zeros(2, 3)
    static_out = torch.zeros(2, 3)

    def capture(facts: Any, args: Sequence[Any]) -> Any:
        return fakes.captured_graph(
            fakes.WritesOutput(static_out, placeholder),
            placeholders={1: placeholder},
            outputs=[static_out],
            static_ptrs=[None, None, None],
        )

    fakes.use_decide(monkeypatch, fakes.decides_graph(capture))
    monkeypatch.setattr(grace.slot.torch_compat, "compiled_call_generation", lambda: generation[0])
    cpu = torch.device("cpu")
    plan = RunnerPlan("h", device=cpu, static_indices=(), dynamic_indices=(1,), scalar_indices=(2,))
    runner = GraceRunner(lambda w, x, n: [x * 2], plan, GraceOptions(**options), None)
    return runner, static_out


def test_a_graph_never_overwrites_outputs_held_within_one_compiled_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One compiled call (generation) runs the same graph per layer and keeps every layer's output: no
    replay may overwrite an output still held; across calls outputs are overwritten, as documented. One
    set of outputs (Note: [Output sets] in grace.outputsets): the held calls run without the graph."""
    generation = [1]
    runner, static_out = _held_output_runner(monkeypatch, generation, max_output_sets=1)
    w = torch.ones(())
    layers = [torch.full((2, 3), float(k)) for k in range(4)]
    runner(w, layers[0], 1)  # warm-up, no graph
    kept = [runner(w, x, 1)[0] for x in layers[1:]]  # the deciding call's replay, then two more
    for x, out in zip(layers[1:], kept, strict=True):
        torch.testing.assert_close(out, x * 2)  # each layer's output intact
    assert kept[0] is static_out and kept[1] is not static_out and kept[2] is not static_out
    (record,) = stats.snapshot()
    assert record["held_output_calls"] == 2 and "outputs_held" in {s["code"] for s in record["skip_reasons"]}

    generation[0] = 2  # the next compiled call: replays hand out aliases of the outputs from now on
    first = runner(w, layers[1], 1)[0]
    assert first is not static_out and first.data_ptr() == static_out.data_ptr()
    second = runner(w, layers[2], 1)[0]  # ``first`` is held: no replay
    torch.testing.assert_close(first, layers[1] * 2)
    torch.testing.assert_close(second, layers[2] * 2)
    view = first[:1]  # a view made of an alias holds the storage as well
    del first
    third = runner(w, layers[3], 1)[0]
    torch.testing.assert_close(view, layers[1][:1] * 2)
    torch.testing.assert_close(third, layers[3] * 2)
    assert third.data_ptr() != static_out.data_ptr()
    del view, second, third
    fourth = runner(w, layers[0], 1)[0]  # nothing of the last replay is held any more: replayed
    assert fourth.data_ptr() == static_out.data_ptr()
    torch.testing.assert_close(fourth, layers[0] * 2)
    (record,) = stats.snapshot()
    assert record["held_output_calls"] == 4 and record["graph_launches"] == 3
    assert (record["graphs_held"], record["output_bytes_held"]) == (1, 2 * 3 * 4)


def test_cloned_outputs_are_never_held(monkeypatch: pytest.MonkeyPatch) -> None:
    generation = [1]
    runner, _ = _held_output_runner(monkeypatch, generation, clone_outputs=True)
    w = torch.ones(())
    layers = [torch.full((2, 3), float(k)) for k in range(4)]
    outs = [runner(w, x, 1)[0] for x in layers]
    for x, out in zip(layers, outs, strict=True):
        torch.testing.assert_close(out, x * 2)
    (record,) = stats.snapshot()
    assert record["held_output_calls"] == 0 and record["graph_launches"] == 3


def test_an_input_on_another_device_at_run_time_gets_a_slot_without_a_graph(cpu_runner: list[int]) -> None:
    """A backward may get a tensor on the CPU where its example input was on the GPU (a random op's seed):
    such a call has a signature of its own and never reaches a deciding call (the meta device stands for
    the other device here)."""
    plan = RunnerPlan("h", torch.device("cpu"), static_indices=(), dynamic_indices=(0,), scalar_indices=())
    runner = GraceRunner(lambda x: [x * 2], plan, GraceOptions(warmup_calls=0), None)
    (out,) = runner(torch.ones(3))
    assert cpu_runner == [1] and out.device.type == "cpu"
    (elsewhere,) = runner(torch.ones(3, device="meta"))
    assert cpu_runner == [1] and elsewhere.device.type == "meta"
    records = {r["signature"]: r for r in stats.snapshot()}
    other = next(r for sig, r in records.items() if sig.endswith("@meta"))
    assert other["variant"] == "no_graph" and other["skip_reasons"][0]["code"] == "cpu_input"


def test_calls_with_an_input_elsewhere_count_as_warm_up_of_the_same_shapes(cpu_runner: list[int]) -> None:
    """Note: [Warm-up per signature, not per placement]: a backward first given host seeds (the meta
    device stands for the other device) decides on its first call with them on the graph's device; a
    signature whose shapes were never seen still warms up first."""
    plan = RunnerPlan("h", torch.device("cpu"), static_indices=(), dynamic_indices=(0, 1), scalar_indices=())
    runner = GraceRunner(lambda x, seed: [x * 2], plan, GraceOptions(warmup_calls=1), None)
    runner(torch.ones(3), torch.ones((), device="meta"))
    assert cpu_runner == []  # a slot without a graph: no deciding call
    runner(torch.ones(3), torch.ones(()))
    assert cpu_runner == [1]  # the same shapes on the graph's device: no warm-up call of their own
    runner(torch.ones(4), torch.ones(()))
    assert cpu_runner == [1]  # new shapes: a warm-up call first
    runner(torch.ones(4), torch.ones(()))
    assert cpu_runner == [1, 1]


def test_a_deciding_call_that_already_ran_returns_its_output_even_when_it_is_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A no-graph decision whose call already ran (``ran``) is the call: the callable is not run again
    for a result, not even when that result is None (an optimizer step returns nothing)."""
    from grace.rerun import CallStart

    runs: list[int] = []

    def compiled(w: torch.Tensor, x: torch.Tensor, n: int) -> None:
        runs.append(1)

    def decide(facts: Any, args: Sequence[Any]) -> SlotDecision:
        facts.compiled(*args)  # the deciding call's one run
        start = CallStart(args, (), random=False, device=None)
        return SlotDecision(Variant.NO_GRAPH, output=None, start=start, ran=True)

    fakes.use_decide(monkeypatch, decide)
    plan = RunnerPlan(graph_hash="h", device=torch.device("cpu"), static_indices=(0,), dynamic_indices=(1,),
                      scalar_indices=(2,))  # fmt: skip
    runner = GraceRunner(compiled, plan, GraceOptions(warmup_calls=0), None)
    assert runner(torch.ones(()), torch.ones(2), 1) is None
    assert runs == [1]
    assert runner(torch.ones(()), torch.ones(2), 1) is None  # a steady no-graph call: one run
    assert runs == [1, 1]
