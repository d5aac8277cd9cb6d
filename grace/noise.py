"""The callable's own run-to-run spread, allowed in the numeric checks of its graph.

Note: [Run-to-run noise]
A callable whose kernels reduce in no fixed order (atomic adds: an embedding's or a scatter's
backward; split-K) gives a slightly different result on every run, graph or not, so a graph's replay
can differ from the no-graph reference by more than the dtype's tolerance while being as right as the
reference. When a check fails so, the deciding call runs the no-graph callable a second time on the
same inputs, from the same generator states and, for a callable that writes its inputs, from the
inputs the call found (``grace.rerun.CallStart.restore``, as every extra run starts): where the two
no-graph runs differ, the callable's own spread at that output or written input (``run_to_run_noise``,
times ``NOISE_FACTOR``; written inputs are named under ``MUTATED``) is allowed there in every later
check of the slot. A wrong result (stale inputs, a wrong pointer) differs by far more than the
callable's own spread; where two runs agree (equal infinities count as agreeing), nothing is allowed
beyond the dtype's tolerance, nor where they differ by a NaN or an infinity (no finite spread).

Note: [Flips beside noise]
An integer or boolean output computed from noisy floats flips where a float lies within the spread of
its threshold: a ReLU's or LeakyReLU's mask saved for the backward (dcgan), an argmax over near-ties.
Two no-graph runs may happen to agree on such an output while a replay flips an element, so where the
two runs differ in any floating-point place, every integer or boolean place (outputs and written
inputs) may differ from the reference in at most ``FLIP_FRACTION`` of its elements (rounded down: a
small tensor, a Philox seed or a step count, may not differ at all). A wrong result (stale inputs, a
wrong pointer, another dropout mask) differs in a large share of the elements, far above that.

Design: ``run_to_run_noise`` names each floating-point output by its place in the output structure
(``"[1]"``, as ``grace.scg.outputs_match`` walks it) with ``NOISE_FACTOR`` times the two runs' largest
difference there; ``flip_allowances`` names each integer or boolean place with the count of its
elements that may differ; ``allow_noise`` is the deciding call's step (grace.decide); the slot keeps what it
found for the checks of later calls (grace.verify).

Invariant: nothing is allowed where two no-graph runs agree; the second run starts from the call's
state, so it applies no side effect the caller sees (the rule in grace.rerun: the run whose output the
caller gets is a later one, itself started from a restore).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from grace.reasons import SkipCode, SkipReason
from grace.rerun import CallStart
from grace.runplan import SlotFacts
from grace.scg import MUTATED, Variant, max_abs_difference
from grace.verify import synchronize

NOISE_FACTOR = 4.0
FLIP_FRACTION = 1e-3  # Note: [Flips beside noise]


def run_to_run_noise(first: Any, second: Any, at: str = "") -> dict[str, float]:
    """Per floating-point tensor of two runs' outputs, by its place in the structure (``""`` for a lone
    tensor), ``NOISE_FACTOR`` times their largest difference, where they differ by a finite amount: a
    NaN or an infinity in one run only is no spread a check could allow (it would allow any value)."""
    if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor):
        same_layout = first.shape == second.shape and first.dtype == second.dtype
        if not (same_layout and first.dtype.is_floating_point):
            return {}
        worst = max_abs_difference(first, second)
        return {at: NOISE_FACTOR * worst} if 0 < worst < math.inf else {}
    if isinstance(first, (list, tuple)) and isinstance(second, (list, tuple)) and len(first) == len(second):
        found: dict[str, float] = {}
        for i, (a, b) in enumerate(zip(first, second, strict=True)):
            found.update(run_to_run_noise(a, b, f"{at}[{i}]"))
        return found
    return {}


def flip_allowances(values: Any, at: str = "") -> dict[str, float]:
    """Per integer or boolean tensor of ``values``, by its place, how many of its elements may differ
    (Note: [Flips beside noise]); places where none may are left out."""
    if isinstance(values, torch.Tensor):
        if values.dtype.is_floating_point or values.dtype.is_complex:
            return {}
        allowed = int(values.numel() * FLIP_FRACTION)
        return {at: float(allowed)} if allowed > 0 else {}
    if isinstance(values, (list, tuple)):
        found: dict[str, float] = {}
        for i, item in enumerate(values):
            found.update(flip_allowances(item, f"{at}[{i}]"))
        return found
    return {}


def differs(problem: str | None) -> bool:
    """Whether a check failed on values (not on a failed replay, a structure or a PI plan's health)."""
    return problem is not None and (
        "max abs difference" in problem or "integer/bool values differ" in problem
    )


def written_inputs(facts: SlotFacts, args: Sequence[Any]) -> list[Any]:
    """The inputs the slot's callable writes, in the order its checks compare them."""
    return [args[i] for i in facts.mutated]


def measure(
    facts: SlotFacts, args: Sequence[Any], reference: Any, start: CallStart, reference_state: Sequence[Any]
) -> dict[str, float]:
    """A second no-graph run on the same inputs, from the call's state, against the reference (its
    outputs and ``reference_state``, the written inputs it left); a spread found is recorded with the
    slot's reasons."""
    start.restore()
    second = facts.compiled(*args)
    synchronize(facts.device)
    noise = run_to_run_noise(reference, second)
    del second
    if reference_state:
        noise.update(run_to_run_noise(list(reference_state), written_inputs(facts, args), MUTATED))
    if noise:
        worst = max(noise.values()) / NOISE_FACTOR
        facts.record.add_skip(
            SkipReason(
                SkipCode.NUMERIC_NOISE,
                f"two no-graph runs on the same inputs differ (up to {worst:.3g} at {len(noise)} "
                f"output(s)): the slot's checks allow {NOISE_FACTOR:g}x that spread there, and "
                f"{FLIP_FRACTION:g} of the elements of integer/bool outputs to differ",
            )
        )
        noise.update(flip_allowances(reference))
        noise.update(flip_allowances(list(reference_state), MUTATED))
    return noise


def allow_noise(
    problems: dict[Variant, str | None],
    recheck: Callable[[Variant], str | None],
    facts: SlotFacts,
    args: Sequence[Any],
    reference: Any,
    start: CallStart,
    noise: dict[str, float],
    reference_state: Sequence[Any] = (),
) -> dict[Variant, str | None]:
    """Where checks failed on values, measure the no-graph callable's own spread into ``noise`` and
    check those variants again (the module docstring)."""
    if not any(differs(p) for p in problems.values()):
        return problems
    noise.update(measure(facts, args, reference, start, reference_state))
    if not noise:
        return problems
    return {v: recheck(v) if differs(p) else p for v, p in problems.items()}
