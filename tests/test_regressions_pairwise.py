"""Pairwise performance against a baseline run (matrix.regressions.pairwise)."""

from __future__ import annotations

import random

import pytest

from matrix.regressions.observations import PerfSample
from matrix.regressions.pairwise import Change, compare_one, compare_runs, speedups
from matrix.regressions.thresholds import PairwiseThresholds, RatioOverride

TH = PairwiseThresholds()


def sample(
    level: float,
    n: int = 30,
    noise: float = 0.02,
    seed: int = 0,
    workload: str = "w",
    mode: str = "grace",
    code: str = "h",
) -> PerfSample:
    rng = random.Random(seed)
    return PerfSample.from_samples(
        workload, mode, [level * (1 + abs(rng.gauss(0, noise))) for _ in range(n)], code_hash=code
    )


def test_ten_percent_slower_and_significant_is_a_regression() -> None:
    result = compare_one(sample(1.0, seed=1), sample(1.1, seed=2), TH)
    assert result.change is Change.REGRESSION
    assert result.ratio == pytest.approx(1.1, rel=0.03)
    assert result.p_value is not None and result.p_value < TH.alpha


def test_faster_is_an_improvement() -> None:
    assert compare_one(sample(1.0, seed=1), sample(0.85, seed=2), TH).change is Change.IMPROVEMENT


def test_significant_but_inside_the_band_is_not_flagged() -> None:
    # 3% slower with many tight samples: certainly significant, but inside the 5% band
    result = compare_one(
        sample(1.0, n=200, noise=0.001, seed=1), sample(1.03, n=200, noise=0.001, seed=2), TH
    )
    assert result.change is Change.UNCHANGED
    assert result.p_value is None  # the test is only run outside the band


def test_past_the_band_but_not_significant_is_not_flagged() -> None:
    # medians 8% apart, but the two sample sets overlap almost completely (bimodal noise)
    base = PerfSample.from_samples("w", "m", [1.0, 1.16, 1.0, 1.16, 1.0, 1.16, 1.0])
    new = PerfSample.from_samples("w", "m", [1.16, 1.0, 1.16, 1.0, 1.16, 1.0, 1.16])
    result = compare_one(base, new, TH)
    assert result.ratio > 1.05
    assert result.p_value is not None and result.p_value >= TH.alpha
    assert result.change is Change.UNCHANGED


def test_too_few_samples_is_inconclusive() -> None:
    result = compare_one(sample(1.0, n=3), sample(2.0, n=3), TH)
    assert result.change is Change.INCONCLUSIVE and result.p_value is None


def test_override_widens_the_band_for_matching_workloads() -> None:
    th = PairwiseThresholds(overrides=(RatioOverride(workload="noisy*", mode="*", ratio=0.2),))
    base, new = sample(1.0, seed=1, workload="noisy_llm"), sample(1.1, seed=2, workload="noisy_llm")
    assert compare_one(base, new, th).change is Change.UNCHANGED
    assert compare_one(sample(1.0, seed=1), sample(1.1, seed=2), th).change is Change.REGRESSION


def test_code_hash_change_is_reported() -> None:
    assert compare_one(sample(1.0, code="a"), sample(1.0, seed=3, code="b"), TH).code_changed


def test_aggregates_only_over_workloads_present_in_both_runs() -> None:
    base = {
        ("a", "grace"): sample(1.0, seed=1, workload="a"),
        ("gone", "grace"): sample(9.0, seed=2, workload="gone"),
    }
    new = {
        ("a", "grace"): sample(1.0, seed=3, workload="a"),
        ("added", "grace"): sample(0.1, seed=4, workload="added"),
    }
    report = compare_runs(base, new, TH)
    assert [(r.workload, r.mode) for r in report.results] == [("a", "grace")]
    (agg,) = report.aggregates
    assert agg.workloads == 1 and agg.geomean_ratio == pytest.approx(1.0, rel=0.03)
    assert report.only_in_baseline == (("gone", "grace"),)
    assert report.only_in_new == (("added", "grace"),)


def test_regressions_and_improvements_lists() -> None:
    base = {
        ("a", "m"): sample(1.0, seed=1, workload="a", mode="m"),
        ("b", "m"): sample(1.0, seed=2, workload="b", mode="m"),
    }
    new = {
        ("a", "m"): sample(1.3, seed=3, workload="a", mode="m"),
        ("b", "m"): sample(0.7, seed=4, workload="b", mode="m"),
    }
    report = compare_runs(base, new, TH)
    assert [r.workload for r in report.regressions] == ["a"]
    assert [r.workload for r in report.improvements] == ["b"]


def test_headline_speedup_uses_workloads_with_both_modes() -> None:
    medians = {("a", "grace"): 1.0, ("a", "inductor"): 2.0, ("b", "grace"): 1.0, ("c", "inductor"): 5.0}
    value, n = speedups(medians, "grace", "inductor")
    assert (value, n) == (2.0, 1)
    assert speedups(medians, "pt2cg", "inductor") == (None, 0)
