"""Note: [Run-to-run noise] (grace.noise) on CPU for a callable that writes its inputs (BatchNorm's
running statistics, an optimizer's state): the second no-graph run starts from the inputs the call found,
its spread is measured at the outputs and at the written inputs, and nothing is allowed where the two
runs agree."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from grace.noise import FLIP_FRACTION, NOISE_FACTOR, allow_noise, flip_allowances, measure
from grace.reasons import SkipReason
from grace.rerun import CallStart
from grace.scg import MUTATED, Variant, outputs_match


class Record:
    def __init__(self) -> None:
        self.skips: list[SkipReason] = []

    def add_skip(self, reason: SkipReason) -> None:
        self.skips.append(reason)


class RunningMean:
    """``stat = 0.9 * stat + 0.1 * x.mean(0)`` in place, returns ``x - stat``; every run after the first
    is ``spread`` off the first (as atomic adds make a reduction's result vary), in output and state."""

    def __init__(self, spread: float) -> None:
        self.spread = spread
        self.runs = 0
        self.starts: list[torch.Tensor] = []

    def __call__(self, x: torch.Tensor, stat: torch.Tensor) -> tuple[torch.Tensor]:
        self.runs += 1
        self.starts.append(stat.clone())
        off = 0.0 if self.runs == 1 else self.spread
        stat.mul_(0.9).add_(x.mean(0) * 0.1 + off)
        return (x - stat + 2 * off,)


def _facts(fn: RunningMean) -> Any:
    return SimpleNamespace(compiled=fn, mutated=(1,), device=torch.device("cpu"), record=Record())


def _first_run(fn: RunningMean) -> tuple[list[torch.Tensor], CallStart, Any, list[torch.Tensor]]:
    torch.manual_seed(0)
    args = [torch.randn(8, 4), torch.randn(4)]
    start = CallStart(args, [1], False, torch.device("cpu"))
    reference = fn(*args)
    return args, start, reference, [args[1].clone()]


def test_the_second_run_starts_from_the_call_and_measures_outputs_and_written_inputs() -> None:
    fn = RunningMean(spread=1e-3)
    args, start, reference, state = _first_run(fn)
    facts = _facts(fn)
    noise = measure(facts, args, reference, start, state)
    torch.testing.assert_close(fn.starts[1], fn.starts[0], rtol=0, atol=0)  # not from the first's result
    assert set(noise) == {"[0]", f"{MUTATED}[0]"}
    assert all(abs(v - NOISE_FACTOR * 1e-3) < 1e-4 for v in noise.values())
    assert facts.record.skips and "two no-graph runs" in facts.record.skips[0].detail


def test_a_written_input_within_the_spread_passes_and_one_beyond_it_does_not() -> None:
    fn = RunningMean(spread=1e-3)
    args, start, reference, state = _first_run(fn)
    noise = measure(_facts(fn), args, reference, start, state)
    near = [state[0] + 2e-3]
    far = [state[0] + 0.5]
    assert outputs_match(state, near, "mutated input", noise, MUTATED) is None
    assert outputs_match(state, far, "mutated input", noise, MUTATED) is not None
    assert outputs_match(state, near, "mutated input", {}, MUTATED) is not None  # no spread: atol only


def test_runs_that_agree_allow_nothing_and_checks_are_not_repeated() -> None:
    fn = RunningMean(spread=0.0)
    args, start, reference, state = _first_run(fn)
    rechecked: list[Variant] = []

    def recheck(variant: Variant) -> str | None:
        rechecked.append(variant)
        return None

    noise: dict[str, float] = {}
    problems: dict[Variant, str | None] = {Variant.GRAPH_COPIES: "output[0]: max abs difference 0.5"}
    after = allow_noise(problems, recheck, _facts(fn), args, reference, start, noise, state)
    assert noise == {} and rechecked == [] and after == problems
    assert fn.runs == 2


class NoisyMask:
    """``(x * w, x * w > 0)``: every run after the first is ``spread`` off the first in its float
    output, as atomic adds make it; the mask is the first run's on every run."""

    def __init__(self, spread: float) -> None:
        self.spread = spread
        self.runs = 0

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.runs += 1
        y = x * w
        return y + (0.0 if self.runs == 1 else self.spread), y > 0


def _mask_call(spread: float) -> tuple[Any, list[torch.Tensor], CallStart, Any]:
    fn = NoisyMask(spread)
    torch.manual_seed(0)
    args = [torch.randn(100, 100), torch.randn(100)]
    facts = SimpleNamespace(compiled=fn, mutated=(), device=torch.device("cpu"), record=Record())
    return facts, args, CallStart(args, [], False, torch.device("cpu")), fn(*args)


def _flipped(mask: torch.Tensor, count: int) -> torch.Tensor:
    out = mask.clone().flatten()
    out[:count] = ~out[:count]
    return out.view_as(mask)


def test_a_noisy_callable_allows_a_few_flipped_mask_elements_and_no_more() -> None:
    facts, args, start, reference = _mask_call(spread=1e-3)
    noise = measure(facts, args, reference, start, [])
    allowed = int(reference[1].numel() * FLIP_FRACTION)  # 10 of 10,000
    assert noise["[1]"] == allowed and "[0]" in noise
    few = (reference[0], _flipped(reference[1], allowed))
    many = (reference[0], _flipped(reference[1], allowed + 1))
    assert outputs_match(reference, few, noise=noise) is None
    problem = outputs_match(reference, many, noise=noise)
    assert problem is not None and f"{allowed + 1} of 10000" in problem
    assert outputs_match(reference, few, noise={}) is not None  # without a measured spread: exact


def test_a_callable_whose_runs_agree_allows_no_flip() -> None:
    facts, args, start, reference = _mask_call(spread=0.0)
    noise = measure(facts, args, reference, start, [])
    assert noise == {}
    assert outputs_match(reference, (reference[0], _flipped(reference[1], 1)), noise=noise) is not None


def test_a_lone_integer_value_may_never_differ() -> None:
    seed = torch.tensor(1234)
    assert flip_allowances([seed, torch.zeros(999, dtype=torch.bool)]) == {}
    assert flip_allowances([seed, torch.zeros(1000, dtype=torch.bool)]) == {"[1]": 1.0}


def test_equal_infinities_are_no_noise_and_excuse_no_wrong_value() -> None:
    """Two runs that agree, an attention mask's -inf included, measure no spread; one that differs by
    0.5 beside equal infinities measures 4 x 0.5, not infinity, so a candidate 10 off still fails. NaN
    against a number and an infinity against a number stay infinitely far apart."""
    from grace.noise import run_to_run_noise
    from grace.scg import max_abs_difference

    masked = torch.tensor([[0.0, -torch.inf], [1.0, torch.nan]])
    assert run_to_run_noise((masked,), (masked.clone(),)) == {}
    shifted = masked.clone()
    shifted[1, 0] += 0.5
    noise = run_to_run_noise((masked,), (shifted,))
    assert noise == {"[0]": NOISE_FACTOR * 0.5}
    wrong = masked.clone()
    wrong[1, 0] += 10.0
    assert "max abs difference 10" in (outputs_match((masked,), (wrong,), noise=noise) or "")
    assert max_abs_difference(torch.tensor([torch.nan]), torch.tensor([1.0])) == float("inf")
    assert max_abs_difference(torch.tensor([-torch.inf]), torch.tensor([1.0])) == float("inf")
    assert max_abs_difference(torch.tensor([torch.inf]), torch.tensor([-torch.inf])) == float("inf")
    one_nan = masked.clone()
    one_nan[0, 0] = torch.nan
    assert run_to_run_noise((masked,), (one_nan,)) == {}  # no allowance: the check stays strict there
