"""Step detection over the nightly history of one cell x workload x mode.

Problem: pairwise comparison against yesterday misses slow drifts and is fooled by one bad night. What
matters is a lasting change of level: a step. A single outlier that reverts the next night is not one,
and run-to-run noise as large as the step we look for must not produce one either.

Design (binary segmentation on log latencies, then three independent confirmations):
1. Work on log(median latency per run), so a step is a ratio whatever the workload's scale.
2. Noise sigma is estimated robustly from the median absolute first difference, which a step or an
   isolated outlier barely moves.
3. The best split of a segment minimises the summed squared error of the two parts; every part must hold
   at least ``min_segment`` runs, so one outlier (or two, with the default of 3) can never be a segment.
4. A split is accepted only if its error reduction exceeds ``penalty * sigma^2 * log(n)`` (a BIC-style
   penalty: the best of many candidate splits of pure noise rarely reaches it), AND the medians of the two
   parts differ by more than ``min_step``, AND a two-sided Mann-Whitney U test between the parts gives
   p < ``alpha``. Accepted splits are searched again on both sides.

A step near the end of the series is only confirmed once ``min_segment`` runs after it exist; until then
it is not reported (an outlier on the latest night is the pairwise detector's job, with raw samples).
``pending_jump`` names that case for a reader: the latest point moved by more than ``min_step`` from the
median of its level (the points since the last confirmed step), which no step can confirm yet.

Invariants: input values are positive latencies in time order; output steps are sorted by position, and
each step's ``ratio`` is after/before of the neighbouring segments' medians (> 1 means slower).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.stats import mannwhitneyu

from matrix.regressions.thresholds import HistoryThresholds

_MAD_TO_SIGMA = 1.0 / (0.6744897501960817 * math.sqrt(2.0))  # first differences have variance 2 sigma^2
_SIGMA_FLOOR = 1e-4  # log units: 0.01% noise; keeps the penalty finite on perfectly flat series


@dataclass(frozen=True)
class Step:
    index: int  # position of the first point after the step, within the examined series
    before_ms: float  # median of the segment before
    after_ms: float  # median of the segment after
    ratio: float  # after / before; > 1 is slower
    p_value: float

    @property
    def slower(self) -> bool:
        return self.ratio > 1.0


@dataclass(frozen=True)
class PendingJump:
    """The latest point against the median of the points since the last confirmed step (its level)."""

    level_ms: float  # median of the earlier points of the latest level
    last_ms: float

    @property
    def ratio(self) -> float:
        return self.last_ms / self.level_ms

    @property
    def slower(self) -> bool:
        return self.ratio > 1.0


def noise_sigma(logs: Sequence[float]) -> float:
    if len(logs) < 3:
        return _SIGMA_FLOOR
    diffs = [abs(b - a) for a, b in itertools.pairwise(logs)]
    return max(statistics.median(diffs) * _MAD_TO_SIGMA, _SIGMA_FLOOR)


class _Prefix:
    """Prefix sums for O(1) squared error of any slice."""

    def __init__(self, xs: Sequence[float]) -> None:
        self.s = [0.0]
        self.q = [0.0]
        for x in xs:
            self.s.append(self.s[-1] + x)
            self.q.append(self.q[-1] + x * x)

    def sse(self, lo: int, hi: int) -> float:
        n = hi - lo
        if n <= 0:
            return 0.0
        total = self.s[hi] - self.s[lo]
        return max(self.q[hi] - self.q[lo] - total * total / n, 0.0)


def _best_split(prefix: _Prefix, lo: int, hi: int, min_segment: int) -> tuple[int, float] | None:
    if hi - lo < 2 * min_segment:
        return None
    whole = prefix.sse(lo, hi)
    best_k, best_gain = -1, -1.0
    for k in range(lo + min_segment, hi - min_segment + 1):
        gain = whole - prefix.sse(lo, k) - prefix.sse(k, hi)
        if gain > best_gain:
            best_k, best_gain = k, gain
    return best_k, best_gain


def detect_steps(values: Sequence[float], thresholds: HistoryThresholds) -> list[Step]:
    """Lasting changes of level in ``values`` (median latencies in time order, only the last
    ``thresholds.window`` are examined; indices refer to that tail)."""
    series = [float(v) for v in values[-thresholds.window :]]
    if any(not (v > 0 and math.isfinite(v)) for v in series):
        raise ValueError("history values must be positive, finite latencies")
    n = len(series)
    m = thresholds.min_segment
    if n < 2 * m:
        return []
    logs = [math.log(v) for v in series]
    sigma = noise_sigma(logs)
    penalty = thresholds.penalty * sigma * sigma * math.log(n)
    prefix = _Prefix(logs)
    cuts: list[int] = []
    pending = [(0, n)]
    while pending:
        lo, hi = pending.pop()
        found = _best_split(prefix, lo, hi, m)
        if found is None:
            continue
        k, gain = found
        if gain <= penalty:
            continue
        left, right = series[lo:k], series[k:hi]
        ratio = statistics.median(right) / statistics.median(left)
        if abs(math.log(ratio)) < math.log1p(thresholds.min_step):
            continue
        if _two_sided_p(left, right) >= thresholds.alpha:
            continue
        cuts.append(k)
        pending.extend([(lo, k), (k, hi)])
    return _steps_from_cuts(series, sorted(cuts))


def _two_sided_p(left: Sequence[float], right: Sequence[float]) -> float:
    p = float(mannwhitneyu(right, left, alternative="two-sided").pvalue)
    return 1.0 if math.isnan(p) else p


def _steps_from_cuts(series: Sequence[float], cuts: Sequence[int]) -> list[Step]:
    """Describe each cut by the medians of its neighbouring segments (between the adjacent cuts)."""
    bounds = [0, *cuts, len(series)]
    steps = []
    for i, k in enumerate(cuts, start=1):
        left, right = series[bounds[i - 1] : k], series[k : bounds[i + 1]]
        before, after = statistics.median(left), statistics.median(right)
        steps.append(Step(k, before, after, after / before, _two_sided_p(left, right)))
    return steps


def new_steps(values: Sequence[float], thresholds: HistoryThresholds) -> list[Step]:
    """Steps that the latest point confirmed: found with it, not found (in the same direction, within
    ``min_segment`` positions) without it. These are what a nightly run should alert on once."""
    current = detect_steps(values, thresholds)
    if not current:
        return []
    shift = 1 if len(values) > thresholds.window else 0  # the window slid by one point
    earlier = detect_steps(values[:-1], thresholds)
    tolerance = thresholds.min_segment
    fresh = []
    for step in current:
        known = any(
            old.slower == step.slower and abs((old.index - shift) - step.index) < tolerance for old in earlier
        )
        if not known:
            fresh.append(step)
    return fresh


def pending_jump(
    values: Sequence[float], steps: Sequence[Step], thresholds: HistoryThresholds
) -> PendingJump | None:
    """The latest point's jump past ``min_step`` from its level, where ``steps`` are ``detect_steps`` of the
    same ``values``: a step at the latest point cannot be confirmed (``min_segment`` >= 2 runs must follow
    a step's start), so any such jump is unconfirmed. None without one or without an earlier point."""
    series = [float(v) for v in values[-thresholds.window :]]
    start = max((s.index for s in steps), default=0)
    level = series[start:-1]
    if not level:
        return None
    jump = PendingJump(statistics.median(level), series[-1])
    return jump if abs(math.log(jump.ratio)) > math.log1p(thresholds.min_step) else None
