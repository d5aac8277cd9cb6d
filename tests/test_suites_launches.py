"""Profiler trace reduction, interleaving and grace.stats reading, on synthetic data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from suites import grace_stats
from suites.launches import facts_from_trace, steady_from_trace
from suites.timing import interleaved_order


def ev(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_direct_and_graph_kernels() -> None:
    trace = {
        "traceEvents": [
            ev("cuda_runtime", "cudaLaunchKernel", 0, 2, correlation=1),
            ev("kernel", "k_direct", 10, 5, correlation=1),
            ev("cuda_driver", "cuLaunchKernel", 3, 2, correlation=2),
            ev("kernel", "triton_poi", 16, 4, correlation=2),
            ev("cuda_runtime", "cudaGraphLaunch", 5, 3, correlation=3),
            ev("kernel", "g1", 30, 2, correlation=3),
            ev("kernel", "g2", 32, 2, correlation=3),
            ev("kernel", "g3", 40, 1, **{"correlation": 99, "graph node id": 7}),
            ev("gpu_memcpy", "Memcpy DtoD", 34, 1, correlation=3, bytes=4096),
            ev("gpu_memset", "Memset", 50, 1, correlation=4),
            {"ph": "i", "cat": "kernel", "name": "instant, ignored"},
            ev("cpu_op", "aten::add", 0, 100),
        ]
    }
    facts = facts_from_trace(trace)
    assert facts.kernel_launches == 2
    assert facts.graph_launches == 1
    assert facts.kernels_in_graphs == 3
    assert facts.memcpy_count == 1 and facts.memcpy_bytes == 4096 and facts.memset_count == 1
    assert facts.kernel_ms == pytest.approx(14 / 1000)
    # busy: [10,15] [16,20] [30,32] [32,34] [34,35] [40,41] [50,51] -> 5 + 4 + 5 + 1 + 1 = 16 us
    assert facts.busy_ms == pytest.approx(16 / 1000)


def test_overlapping_activity_is_not_double_counted() -> None:
    trace = {"traceEvents": [ev("kernel", "a", 0, 10), ev("kernel", "b", 5, 10), ev("kernel", "c", 30, 5)]}
    facts = facts_from_trace(trace)
    assert facts.busy_ms == pytest.approx(20 / 1000) and facts.kernel_ms == pytest.approx(25 / 1000)


def test_empty_trace() -> None:
    facts = facts_from_trace({"traceEvents": []})
    assert (facts.kernel_launches, facts.graph_launches, facts.busy_ms) == (0, 0, 0.0)


def test_steady_figures_are_per_call() -> None:
    # two calls: copy [0,2] + kernel [3,10], then copy [12,14] + kernel [14,21]; CPU events ignored
    trace = {
        "traceEvents": [
            ev("gpu_memcpy", "Memcpy HtoD", 0, 2),
            ev("kernel", "k", 3, 7),
            ev("gpu_memcpy", "Memcpy HtoD", 12, 2),
            ev("kernel", "k", 14, 7),
            ev("cpu_op", "aten::add", 0, 100),
        ]
    }
    facts = steady_from_trace(trace, 2)
    assert facts.kernel_ms == pytest.approx(7 / 1000) and facts.memcpy_ms == pytest.approx(2 / 1000)
    assert facts.busy_ms == pytest.approx(9 / 1000)
    assert facts.span_ms == pytest.approx(10.5 / 1000)  # 21 us over 2 calls
    assert facts.idle_ms == pytest.approx(1.5 / 1000)  # gaps [2,3] and [10,12]
    with pytest.raises(ValueError):
        steady_from_trace(trace, 0)


def test_interleaved_order_varies_positions_and_predecessors() -> None:
    names = ["a", "b", "c", "d"]
    orders = interleaved_order(names, 200)
    assert len(orders) == 200 and all(sorted(o) == names for o in orders)
    assert interleaved_order(names, 200) == orders  # seeded: the same plan every run
    assert interleaved_order(names, 200, seed=1) != orders
    for position in range(4):  # every name in every position, about equally often
        counts = {n: sum(o[position] == n for o in orders) for n in names}
        assert min(counts.values()) >= 30, counts
    before_a = {o[o.index("a") - 1] for o in orders if o.index("a") > 0}
    assert before_a == {"b", "c", "d"}  # no fixed predecessor
    assert interleaved_order([], 3) == []


@dataclass
class Slot:
    graph_id: str
    copy_bytes_per_replay: int


class Holder:
    def __init__(self, graphs: Any) -> None:
        self.graphs = graphs


@pytest.mark.parametrize(
    "raw",
    [
        [
            {"graph_id": "g1.1", "copy_bytes_per_replay": 100},
            {"graph_id": "g2.2", "copy_bytes_per_replay": 28},
        ],
        {"g1.1": {"copy_bytes_per_replay": 100}, "g2.2": {"copy_bytes_per_replay": 28}},
        Holder([Slot("g1.1", 100), Slot("g2.2", 28)]),
        {"graphs": [Slot("g1.1", 100), Slot("g2.2", 28)]},
    ],
)
def test_grace_stats_shapes(raw: Any) -> None:
    entries = grace_stats._entries(raw)
    assert set(entries) == {"g1.1", "g2.2"}
    assert grace_stats.total(entries, "copy_bytes_per_replay") == 128
    assert grace_stats.total(grace_stats.select(entries, ["g2.2"]), "copy_bytes_per_replay") == 28
    assert grace_stats.total(entries, "absent") is None


def test_grace_stats_without_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    monkeypatch.setitem(sys.modules, "grace", types.ModuleType("grace"))  # no stats attribute
    assert grace_stats.snapshot() == {} and grace_stats.graph_keys() == set()
