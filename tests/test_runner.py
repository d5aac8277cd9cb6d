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
