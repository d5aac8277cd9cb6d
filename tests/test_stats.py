"""grace.stats: records, derived per-call figures, snapshot copies, reset semantics."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from grace import stats
from grace.reasons import SkipCode, SkipReason
from grace.scg import Decision, DecisionSource, Variant


@pytest.fixture(autouse=True)
def clean_stats() -> Iterator[None]:
    stats.forget_all()
    yield
    stats.forget_all()


def test_record_snapshot_and_per_call_figures() -> None:
    record = stats.new_record(7, "hash", "float32[4]/[1]", "cuda:0")
    record.kernel_nodes = 12
    record.launch_nodes = 14
    assert stats.snapshot()[0]["kernel_launches_per_call"] == 14  # pending: kernels run outside graphs
    record.variant = Variant.GRAPH_COPIES
    record.copy_bytes_per_replay = 1024
    record.copy_launches_per_replay = 1
    record.calls, record.graph_calls = 4, 3
    record.decision = Decision(Variant.GRAPH_COPIES, DecisionSource.PROFILED, medians_ms={"no_graph": 1.0})
    (snap,) = stats.snapshot()
    assert snap["graph_id"].startswith("g7.")
    assert snap["graph_launches_per_call"] == pytest.approx(0.75)
    assert snap["steady_graph_launches_per_call"] == 1
    assert snap["kernel_launches_per_call"] == 1
    assert snap["copy_bytes_per_replay"] == 1024
    assert snap["decision"]["medians_ms"] == {"no_graph": 1.0}
    snap["calls"] = 99
    assert stats.snapshot()[0]["calls"] == 4


def test_skip_reasons_are_deduplicated_and_counted() -> None:
    record = stats.new_record(1, "h", "*", "cuda:0")
    reason = SkipReason(SkipCode.CPU_INPUT, "input x is on cpu")
    record.add_skip(reason)
    record.add_skip(reason)
    assert stats.snapshot()[0]["skip_reasons"] == [{"code": "cpu_input", "detail": "input x is on cpu"}]
    assert stats.fallback_counts() == {"cpu_input": 2}


def test_reset_zeroes_counters_and_drops_released() -> None:
    live = stats.new_record(1, "h", "a", "cuda:0")
    gone = stats.new_record(1, "h", "b", "cuda:0")
    live.calls = live.graph_calls = 5
    live.variant = Variant.GRAPH_PI
    gone.released = True
    stats.reset()
    (snap,) = stats.snapshot()
    assert snap["signature"] == "a"
    assert snap["calls"] == 0 and snap["graph_launches"] == 0
    assert snap["variant"] == "graph_pi"
    assert stats.fallback_counts() == {}


def test_no_graph_reports_zero_copy_bytes() -> None:
    record = stats.new_record(2, "h", "s", "cuda:0")
    record.copy_bytes_per_replay = 10
    record.variant = Variant.NO_GRAPH
    assert stats.snapshot()[0]["copy_bytes_per_replay"] == 0
    assert stats.snapshot()[0]["steady_graph_launches_per_call"] == 0
