"""Step detection on synthetic nightly histories (matrix.regressions.history)."""

from __future__ import annotations

import random

import pytest

from matrix.regressions.history import detect_steps, new_steps, pending_jump
from matrix.regressions.thresholds import HistoryThresholds

TH = HistoryThresholds()


def noisy(n: int, rng: random.Random, level: float = 2.0, noise: float = 0.02) -> list[float]:
    return [level * (1.0 + rng.gauss(0.0, noise)) for _ in range(n)]


@pytest.mark.parametrize("seed", range(20))
def test_true_ten_percent_step_is_found_where_it_happened(seed: int) -> None:
    rng = random.Random(seed)
    values = noisy(20, rng) + [v * 1.10 for v in noisy(8, rng)]
    steps = detect_steps(values, TH)
    assert len(steps) == 1, steps
    step = steps[0]
    assert abs(step.index - 20) <= 1
    assert step.slower
    assert 1.06 < step.ratio < 1.14
    assert step.p_value < TH.alpha


def test_step_down_is_found_as_faster() -> None:
    rng = random.Random(7)
    values = noisy(15, rng) + [v * 0.9 for v in noisy(6, rng)]
    (step,) = detect_steps(values, TH)
    assert not step.slower and step.ratio < 0.95


def test_noise_as_large_as_the_step_without_a_shift_is_not_a_step() -> None:
    # Uniform noise of +-10% (the size of the step above) around a constant level, 200 histories.
    hits = 0
    for seed in range(200):
        rng = random.Random(1000 + seed)
        values = [2.0 * (1.0 + rng.uniform(-0.10, 0.10)) for _ in range(30)]
        hits += bool(detect_steps(values, TH))
    assert hits <= 2, f"{hits} of 200 pure-noise histories reported a step"


def test_alternating_noise_is_not_a_step() -> None:
    values = [2.0 * (1.1 if i % 2 else 0.9) for i in range(30)]
    assert detect_steps(values, TH) == []


@pytest.mark.parametrize("seed", range(50))
@pytest.mark.parametrize("where", [5, 15, 26])
def test_single_outlier_that_reverts_is_not_a_step(seed: int, where: int) -> None:
    rng = random.Random(seed)
    values = noisy(30, rng)
    values[where] *= 1.6
    assert detect_steps(values, TH) == []


def test_two_night_excursion_is_not_a_step_with_min_segment_three() -> None:
    rng = random.Random(3)
    values = noisy(30, rng)
    values[12] *= 1.4
    values[13] *= 1.4
    assert detect_steps(values, TH) == []


def test_latest_outlier_is_not_reported_until_it_persists() -> None:
    rng = random.Random(11)
    values = noisy(20, rng)
    assert detect_steps([*values, values[-1] * 1.3], TH) == []
    assert detect_steps([*values, values[-1] * 1.3, values[-2] * 1.3], TH) == []
    confirmed = [*values, *(v * 1.3 for v in values[-3:])]
    assert len(detect_steps(confirmed, TH)) == 1


def test_two_steps_are_both_found() -> None:
    rng = random.Random(5)
    values = noisy(12, rng) + [v * 1.15 for v in noisy(12, rng)] + [v * 0.8 for v in noisy(12, rng)]
    steps = detect_steps(values, TH)
    assert [abs(s.index - k) <= 1 for s, k in zip(steps, (12, 24), strict=True)] == [True, True]


def test_window_limits_the_examined_history() -> None:
    rng = random.Random(9)
    values = noisy(10, rng) + [v * 1.2 for v in noisy(30, rng)]
    assert len(detect_steps(values, TH)) == 1
    assert detect_steps(values, HistoryThresholds(window=25)) == []


def test_short_histories_have_no_steps() -> None:
    assert detect_steps([1.0, 1.0, 2.0, 2.0, 2.0], TH) == []


def test_values_must_be_positive_latencies() -> None:
    with pytest.raises(ValueError, match="positive"):
        detect_steps([1.0, 0.0, 1.0, 1.0, 1.0, 1.0], TH)


def test_a_step_is_new_exactly_once_as_nights_go_by() -> None:
    rng = random.Random(21)
    values = noisy(20, rng, noise=0.01) + [v * 1.1 for v in noisy(10, rng, noise=0.01)]
    fresh_at = [n for n in range(6, len(values) + 1) if new_steps(values[:n], TH)]
    assert fresh_at == [20 + TH.min_segment], fresh_at


def pending(values: list[float], th: HistoryThresholds = TH) -> float | None:
    jump = pending_jump(values, detect_steps(values, th), th)
    return None if jump is None else jump.ratio


def test_a_jump_of_the_latest_run_is_pending_until_runs_after_it_confirm_a_step() -> None:
    rng = random.Random(3)
    before = noisy(20, rng, noise=0.01)
    after = [v * 1.2 for v in noisy(TH.min_segment, rng, noise=0.01)]
    ratio = pending(before + after[:1])
    assert ratio is not None and 1.15 < ratio < 1.25
    assert detect_steps(before + after[:1], TH) == []  # the detector cannot confirm it yet
    assert pending(before + after) is None  # confirmed: the latest run belongs to the new level
    assert len(detect_steps(before + after, TH)) == 1


def test_a_faster_jump_is_pending_too() -> None:
    jump = pending_jump([2.0, 2.01, 1.99, 1.7], [], TH)
    assert jump is not None and not jump.slower and jump.level_ms == 2.0


def test_noise_and_short_histories_are_not_pending_jumps() -> None:
    rng = random.Random(11)
    assert all(pending(noisy(n, rng, noise=0.005)) is None for n in range(1, 40))
    assert pending([2.0]) is None


def test_the_pending_threshold_is_the_step_threshold() -> None:
    values = [2.0, 2.0, 2.0, 2.0, 2.3]  # +15%
    assert pending(values, HistoryThresholds(min_step=0.1)) is not None
    assert pending(values, HistoryThresholds(min_step=0.2)) is None
