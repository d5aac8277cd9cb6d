"""GraceRunner on CPU: signatures, LRU bound, release and skip mode. The CUDA-only steps (side-stream
warm-up, deciding call) are replaced by plain calls so that the bookkeeping can be checked here."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

import grace.decide
import grace.runner
from grace import stats
from grace.options import GraceOptions
from grace.reasons import SkipCode, SkipReason
from grace.runner import GraceRunner, RunnerPlan, describe_signature
from grace.scg import Variant


@pytest.fixture(autouse=True)
def cpu_runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    decided: list[int] = []

    def warm(fn: Any, args: Sequence[Any], device: Any) -> Any:
        return fn(*args)

    def decide(slot: grace.runner.GraphSlot, args: Sequence[Any]) -> Any:
        decided.append(1)
        slot.set_no_graph(None)
        return slot.run(args)

    monkeypatch.setattr(grace.runner, "run_on_side_stream", warm)
    monkeypatch.setattr(grace.decide, "decide", decide)
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


class _FakeGraph:
    """What the runner needs of a CapturedGraph: static addresses, a replay, a release."""

    def __init__(self, args: Sequence[Any], static_indices: tuple[int, ...], log: list[str]) -> None:
        self.static_indices = static_indices
        self.static_ptrs = [a.data_ptr() if i in static_indices else None for i, a in enumerate(args)]
        self.name = f"g{sum(1 for e in log if e.startswith('capture'))}"
        self.log = log
        log.append(f"capture {self.name}")

    def static_inputs_unmoved(self, args: Sequence[Any]) -> bool:
        return all(args[i].data_ptr() == self.static_ptrs[i] for i in self.static_indices)

    def run_with_copies(self, args: Sequence[Any], clone: bool) -> Any:
        self.log.append(f"replay {self.name}")
        return [args[1] * args[0] * args[2]]

    def release(self) -> None:
        self.log.append(f"release {self.name}")


def test_graphs_of_earlier_static_addresses_are_used_again(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []

    def capturing_decide(slot: grace.runner.GraphSlot, args: Sequence[Any]) -> Any:
        slot.graph = _FakeGraph(args, slot.runner.plan.static_indices, log)  # type: ignore[assignment]
        slot.record.variant = Variant.GRAPH_COPIES
        slot.run = slot._run_copies
        return slot.run(args)

    monkeypatch.setattr(grace.decide, "decide", capturing_decide)
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
