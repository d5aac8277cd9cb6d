"""SCG on CPU: decision keys, persistence (format version, atomic merge), choice, numeric check."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from grace import scg
from grace.scg import Decision, DecisionCache, DecisionKey, DecisionSource, Variant


def _key(**changes: object) -> DecisionKey:
    base = DecisionKey(
        graph_hash="abc",
        signature="float32[64, 1048576]/[1048576, 1]",
        gpu="NVIDIA H200",
        driver="13000",
        cuda_runtime="13.0",
        torch="2.11.0",
        triton="3.6.0",
        candidates=("no_graph", "graph_copies"),
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    "field,value",
    [
        ("graph_hash", "abd"),
        ("signature", "float32[32, 1048576]/[1048576, 1]"),
        ("gpu", "NVIDIA A100"),
        ("driver", "12080"),
        ("cuda_runtime", "12.8"),
        ("torch", "2.10.0"),
        ("triton", "3.5.0"),
        ("candidates", ("no_graph", "graph_copies", "graph_pi")),
    ],
)
def test_every_key_field_changes_the_digest(field: str, value: object) -> None:
    assert _key().digest == _key().digest
    assert _key(**{field: value}).digest != _key().digest


def _decision(variant: Variant = Variant.NO_GRAPH) -> Decision:
    return Decision(
        variant,
        DecisionSource.PROFILED,
        medians_ms={"no_graph": 0.107, "graph_copies": 0.271},
        samples_ms={"no_graph": (0.1, 0.107, 0.11), "graph_copies": (0.27, 0.271, 0.28)},
    )


def test_decisions_persist_across_cache_objects(tmp_path: Path) -> None:
    DecisionCache(tmp_path).store(_key(), _decision())
    entry = DecisionCache(tmp_path).lookup(_key())
    assert entry is not None
    assert entry["variant"] == "no_graph"
    assert entry["medians_ms"]["graph_copies"] == pytest.approx(0.271)
    assert DecisionCache(tmp_path).lookup(_key(gpu="other")) is None
    data = json.loads((tmp_path / scg.DECISIONS_FILE).read_text())
    assert data["format"] == scg.DECISIONS_FORMAT
    assert data["format_version"] == scg.DECISIONS_FORMAT_VERSION


def test_two_writers_merge(tmp_path: Path) -> None:
    first, second = DecisionCache(tmp_path), DecisionCache(tmp_path)
    first.store(_key(), _decision())
    second.store(_key(torch="2.12.0"), _decision(Variant.GRAPH_COPIES))
    fresh = DecisionCache(tmp_path)
    assert fresh.lookup(_key()) is not None
    assert fresh.lookup(_key(torch="2.12.0"))["variant"] == "graph_copies"  # type: ignore[index]


def test_other_format_version_is_neither_read_nor_overwritten(tmp_path: Path) -> None:
    path = tmp_path / scg.DECISIONS_FILE
    foreign = {"format": scg.DECISIONS_FORMAT, "format_version": 99, "decisions": {_key().digest: {"x": 1}}}
    path.write_text(json.dumps(foreign))
    cache = DecisionCache(tmp_path)
    assert cache.lookup(_key()) is None
    cache.store(_key(), _decision())
    assert json.loads(path.read_text()) == foreign


def test_corrupt_file_is_ignored_and_replaced(tmp_path: Path) -> None:
    (tmp_path / scg.DECISIONS_FILE).write_text("{not json")
    cache = DecisionCache(tmp_path)
    assert cache.lookup(_key()) is None
    cache.store(_key(), _decision())
    assert DecisionCache(tmp_path).lookup(_key()) is not None


def test_lookup_checks_the_stored_key_fields(tmp_path: Path) -> None:
    cache = DecisionCache(tmp_path)
    cache.store(_key(), _decision())
    path = tmp_path / scg.DECISIONS_FILE
    data = json.loads(path.read_text())
    data["decisions"][_key().digest]["key_fields"]["gpu"] = "tampered"
    path.write_text(json.dumps(data))
    assert DecisionCache(tmp_path).lookup(_key()) is None


def test_choose_takes_smallest_median_and_breaks_ties_by_order() -> None:
    assert scg.choose({Variant.NO_GRAPH: 0.107, Variant.GRAPH_COPIES: 0.271}) is Variant.NO_GRAPH
    assert scg.choose({Variant.NO_GRAPH: 1.9, Variant.GRAPH_COPIES: 0.92}) is Variant.GRAPH_COPIES
    assert scg.choose({Variant.GRAPH_PI: 0.5, Variant.NO_GRAPH: 0.5}) is Variant.NO_GRAPH


def test_a_near_tie_within_the_margin_goes_to_the_fastest_graph() -> None:
    medians = {Variant.NO_GRAPH: 13.4995, Variant.GRAPH_PI: 13.5523, Variant.GRAPH_COPIES: 13.6}
    assert scg.choose(medians) is Variant.NO_GRAPH
    assert scg.choose(medians, margin=0.01) is Variant.GRAPH_PI  # 0.39% slower
    assert scg.choose({Variant.NO_GRAPH: 0.1843, Variant.GRAPH_PI: 0.1888}, 0.01) is Variant.NO_GRAPH
    assert scg.choose({Variant.NO_GRAPH: 1.0}, margin=0.5) is Variant.NO_GRAPH
    with pytest.raises(ValueError):
        scg.choose({})
    assert scg.medians({Variant.NO_GRAPH: [3.0, 1.0, 2.0]}) == {Variant.NO_GRAPH: 2.0}


def test_outputs_match_compares_large_tensors_chunk_by_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scg, "COMPARE_CHUNK", 7)  # 50 elements: 8 chunks, the last one short
    a = torch.linspace(-1, 1, 50).reshape(5, 10)
    assert scg.outputs_match(a, a.clone()) is None
    assert scg.outputs_match(a, a + 1e-7) is None
    b = a.clone()
    b[4, 9] += 0.5  # only in the short last chunk
    assert "max abs difference 0.5" in str(scg.outputs_match(a, b))
    c = a.t().contiguous().t()  # same values, other strides
    assert scg.outputs_match(a, c) is None
    nan = a.clone()
    nan[2, 3] = float("nan")
    assert scg.outputs_match(nan, nan.clone()) is None
    assert "inf" in str(scg.outputs_match(nan, a))


def test_outputs_match() -> None:
    a = torch.randn(4, 4)
    assert scg.outputs_match([a, 3], [a.clone(), 3]) is None
    assert scg.outputs_match((a,), (a + 1,)) is not None
    assert "difference" in str(scg.outputs_match(a, a + 1e-2))
    assert scg.outputs_match(a, a + 1e-7) is None
    assert scg.outputs_match(torch.tensor([1, 2]), torch.tensor([1, 3])) is not None
    assert scg.outputs_match(a, a.double()) is not None
    assert scg.outputs_match([a], [a, a]) is not None
    nan = torch.tensor([float("nan")])
    assert scg.outputs_match(nan, nan.clone()) is None


def test_shared_cache_per_directory(tmp_path: Path) -> None:
    assert scg.decision_cache(tmp_path) is scg.decision_cache(tmp_path)
    scg.forget_caches()
    assert scg.decision_cache(tmp_path) is not None


def test_untimed_setup_runs_before_each_run_of_its_variant_outside_the_timed_region(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The setup of a variant (grace.decide drops the cuBLAS workspace before each no-graph run) runs
    before every warm-up and sample of that variant, after the GPU is idle and before the start event."""
    log: list[str] = []

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            self.at = 0.0

        def record(self) -> None:
            log.append("event")
            self.at = float(len(log))

        def elapsed_time(self, end: Event) -> float:
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    runs = {Variant.NO_GRAPH: lambda: log.append("no_graph"), Variant.GRAPH_PI: lambda: log.append("pi")}
    samples = scg.time_variants(
        runs, samples=3, warmup=2, device=None, untimed_setup={Variant.NO_GRAPH: lambda: log.append("setup")}
    )
    assert log.count("setup") == log.count("no_graph") == 5
    for i, entry in enumerate(log):
        if entry == "no_graph":
            before = log[:i]
            last_setup = len(before) - 1 - before[::-1].index("setup")
            assert "no_graph" not in before[last_setup:] and "pi" not in before[last_setup:]
            assert "sync" in before[: last_setup + 1][-2:]  # the GPU was idle when the setup ran
        if entry == "setup" and i + 1 < len(log) and log[i + 1] == "event":
            assert log[i + 2] == "no_graph"  # setup, start event, run: the setup is not timed
    # The timed region of a no-graph sample holds the start event and the run only.
    assert samples[Variant.NO_GRAPH] == [2.0, 2.0, 2.0]
    assert log.count("pi") == 5


def test_a_persisted_decision_is_chosen_again_with_the_current_margin() -> None:
    from grace.choice import cached_decision as _cached_decision

    entry = {"variant": "no_graph", "medians_ms": {"no_graph": 5.166, "graph_pi": 5.187}}
    candidates = [Variant.NO_GRAPH, Variant.GRAPH_PI]
    # Stored without a margin as no graph; 0.4% apart, so a margin of 3% keeps the graph.
    kept = _cached_decision(entry, candidates, {}, "digest", 0.03)
    assert kept is not None and kept.variant is Variant.GRAPH_PI
    assert kept.source is scg.DecisionSource.CACHE
    plain = _cached_decision(entry, candidates, {}, "digest", 0.0)
    assert plain is not None and plain.variant is Variant.NO_GRAPH
    # A candidate the entry never timed: its stored choice stands, when it is still a candidate.
    partial = _cached_decision(entry, [*candidates, Variant.GRAPH_COPIES], {}, "digest", 0.03)
    assert partial is not None and partial.variant is Variant.NO_GRAPH
    assert _cached_decision({"variant": "graph_copies", "medians_ms": {}}, candidates, {}, "d", 0.03) is None
