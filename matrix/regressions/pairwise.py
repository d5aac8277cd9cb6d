"""Performance of one run against a baseline run: per workload x mode, and aggregated.

Problem: GPU timings are noisy. Flagging every median that moved by 5% buries real regressions in false
alarms; a significance test alone flags 0.3% changes that nobody cares about once samples are many.

Design: a workload x mode is flagged only when BOTH its median latency ratio (new / baseline) passes the
band (``pairwise.ratio``, 5% by default, per-workload overrides in thresholds.toml) AND a one-sided
Mann-Whitney U test on the raw samples of the two runs, in the direction of the change, gives
p < ``pairwise.alpha``. Rank-based, so a few outlier samples do not decide it. Fewer than
``min_samples`` raw samples on either side is INCONCLUSIVE, never flagged.

Aggregates (geometric mean of ratios per mode) are taken only over workloads present, with usable
samples, in both runs: a workload added or dropped between runs must not move an aggregate. Those
workloads are listed instead.

Invariants: latencies; ratio > 1 means slower. A ratio of exactly 1 +/- band is not flagged. The test
runs only for changes outside the band (``p_value`` is None inside it: nothing there can be flagged).
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from scipy.stats import mannwhitneyu

from matrix.regressions.observations import PerfSample
from matrix.regressions.thresholds import PairwiseThresholds

PerfKey = tuple[str, str]  # (workload, mode)


class Change(str, enum.Enum):
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    UNCHANGED = "unchanged"  # within the band, or not significant
    INCONCLUSIVE = "inconclusive"  # too few samples to test


@dataclass(frozen=True)
class PairwiseResult:
    workload: str
    mode: str
    baseline_median_ms: float
    new_median_ms: float
    ratio: float
    p_value: float | None
    n_baseline: int
    n_new: int
    band: float
    change: Change
    code_changed: bool  # the workload's code hash differs: the change may be the workload's own
    nodeid: str = ""


@dataclass(frozen=True)
class Aggregate:
    mode: str
    geomean_ratio: float
    workloads: int


@dataclass(frozen=True)
class PairwiseReport:
    results: tuple[PairwiseResult, ...]
    aggregates: tuple[Aggregate, ...]
    only_in_baseline: tuple[PerfKey, ...]
    only_in_new: tuple[PerfKey, ...]

    @property
    def regressions(self) -> list[PairwiseResult]:
        return [r for r in self.results if r.change is Change.REGRESSION]

    @property
    def improvements(self) -> list[PairwiseResult]:
        return [r for r in self.results if r.change is Change.IMPROVEMENT]


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def one_sided_p(new: tuple[float, ...], baseline: tuple[float, ...], slower: bool) -> float:
    """P-value that ``new`` is stochastically greater (``slower``) or smaller than ``baseline``."""
    result = mannwhitneyu(new, baseline, alternative="greater" if slower else "less", method="auto")
    p = float(result.pvalue)
    return 1.0 if math.isnan(p) else p


def compare_one(baseline: PerfSample, new: PerfSample, thresholds: PairwiseThresholds) -> PairwiseResult:
    band = thresholds.ratio_for(new.workload, new.mode)
    ratio = new.median_ms / baseline.median_ms
    n_b, n_n = len(baseline.samples_ms), len(new.samples_ms)
    p: float | None = None
    if min(n_b, n_n) < thresholds.min_samples:
        change = Change.INCONCLUSIVE
    else:
        slower = ratio >= 1.0
        outside = ratio > 1.0 + band if slower else ratio < 1.0 / (1.0 + band)
        change = Change.UNCHANGED
        if outside:  # the test decides only what the band let through (and it costs ~0.5 ms a call)
            p = one_sided_p(new.samples_ms, baseline.samples_ms, slower)
            if p < thresholds.alpha:
                change = Change.REGRESSION if slower else Change.IMPROVEMENT
    return PairwiseResult(
        workload=new.workload,
        mode=new.mode,
        baseline_median_ms=baseline.median_ms,
        new_median_ms=new.median_ms,
        ratio=ratio,
        p_value=p,
        n_baseline=n_b,
        n_new=n_n,
        band=band,
        change=change,
        code_changed=bool(baseline.code_hash and new.code_hash and baseline.code_hash != new.code_hash),
        nodeid=new.nodeid,
    )


def _usable(sample: PerfSample) -> bool:
    return sample.median_ms > 0 and math.isfinite(sample.median_ms) and bool(sample.samples_ms)


def compare_runs(
    baseline: Mapping[PerfKey, PerfSample], new: Mapping[PerfKey, PerfSample], thresholds: PairwiseThresholds
) -> PairwiseReport:
    """Compare every workload x mode present (with usable samples) in both runs."""
    base_ok = {k for k, v in baseline.items() if _usable(v)}
    new_ok = {k for k, v in new.items() if _usable(v)}
    common = sorted(base_ok & new_ok)
    results = tuple(compare_one(baseline[k], new[k], thresholds) for k in common)
    by_mode: dict[str, list[float]] = defaultdict(list)
    for r in results:
        by_mode[r.mode].append(r.ratio)
    aggregates = tuple(
        Aggregate(mode, geomean(ratios), len(ratios)) for mode, ratios in sorted(by_mode.items())
    )
    return PairwiseReport(
        results=results,
        aggregates=aggregates,
        only_in_baseline=tuple(sorted(base_ok - new_ok)),
        only_in_new=tuple(sorted(new_ok - base_ok)),
    )


def speedups(medians: Mapping[PerfKey, float], mode: str, reference: str) -> tuple[float | None, int]:
    """Geometric-mean speedup of ``mode`` over ``reference`` within one run (reference / mode latency),
    over the workloads that have both; (None, 0) when none has both."""
    ratios = []
    for (workload, m), value in medians.items():
        if m != mode:
            continue
        ref = medians.get((workload, reference))
        if ref is not None and ref > 0 and value > 0:
            ratios.append(ref / value)
    if not ratios:
        return None, 0
    return geomean(ratios), len(ratios)
