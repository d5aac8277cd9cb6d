"""A fuzz run: cases of one base seed, one after the other, until the deadline; their counts.

Problem: the fuzzer must be bounded by time (seconds from fuzz.toml or ``GRACE_FUZZ_SECONDS``) yet
deterministic: which cases ran is a prefix of the base seed's sequence, so any of them replays alone.
Compiled state of one case must not leak into the next, and memory must stay bounded over hundreds of
cases.

Design: ``fuzz`` patches Inductor for the run (``fallback_random``: compiled random ops draw from the
same generator calls as eager, so a seeded call is comparable; ``compile_threads`` per device from the
settings) and lifts Dynamo's recompile limit (``suites.modes.prepare_dynamo``); then it runs each case
under each of its profiles (``execute.make_cases``: one model and schedule, several GraceOptions),
resetting Dynamo and grace (``suites.modes.reset_compilers``) before every run, and classifies each
run: passed, failed, failed at a known issue (fuzz.toml ``[[known]]``), or invalid (eager itself
raised). No run starts after the deadline; one started finishes.

Note: [The control run]: a case that fails under grace runs once more under Inductor alone (same model,
schedule and seeds; grace's options do not apply), so a failure reads either "grace only" or "Inductor
alone differs from eager too". The control only informs: it changes no verdict, since a wrong result
under grace is one whoever made it; an upstream bug is acknowledged in fuzz.toml's ``[[known]]``.

Invariant: a ``FuzzSummary`` counts every run that started (``cases``: a case under one profile); the
runs it keeps in full are the failures, the known failures and the invalid ones (bounded by
``max_failures_kept``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from suites.fuzz.compare import Mismatch, MismatchKind
from suites.fuzz.execute import (
    Case,
    CaseResult,
    Compiler,
    grace_compiler,
    inductor_compiler,
    make_cases,
    run_case,
)
from suites.fuzz.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FuzzSummary:
    base_seed: int
    device: str
    deadline_s: float
    seconds: float
    cases: int
    calls: int
    mismatches: int
    failures: tuple[CaseResult, ...] = ()
    known: tuple[tuple[CaseResult, str], ...] = ()
    invalid: tuple[CaseResult, ...] = ()
    profiles: dict[str, int] = field(default_factory=dict)
    features: dict[str, int] = field(default_factory=dict)
    first_case: int = 0
    failed_cases: int = 0  # all of them; ``failures`` keeps the first ``max_failures_kept``
    known_cases: int = 0
    invalid_cases: int = 0

    @property
    def passed(self) -> bool:
        return not self.failures


@contextlib.contextmanager
def fuzz_environment(settings: Settings, device_type: str) -> Iterator[None]:
    """Inductor's and Dynamo's settings of a fuzz run (module docstring), restored afterwards."""
    import torch._inductor.config as inductor_config

    from suites.modes import prepare_dynamo

    prepare_dynamo()
    patches: dict[str, object] = {"fallback_random": True}
    if device_type in settings.compile_threads:
        patches["compile_threads"] = settings.compile_threads[device_type]
    with inductor_config.patch(patches):
        yield


def _reset() -> None:
    from suites.modes import reset_compilers

    reset_compilers()


def fuzz(
    settings: Settings,
    device: torch.device,
    *,
    compiler: Compiler = grace_compiler,
    control: Compiler | None = inductor_compiler,
    deadline_s: float | None = None,
    base_seed: int | None = None,
    first_case: int = 0,
    max_cases: int | None = None,
    reset: Callable[[], None] = _reset,
) -> FuzzSummary:
    """Run cases ``first_case, first_case + 1, ...`` of ``base_seed`` until the deadline (or
    ``max_cases``); the settings give both defaults. A failing case runs again under ``control``
    (``with_control``)."""
    seed = settings.base_seed if base_seed is None else base_seed
    deadline = settings.deadline_for(device.type) if deadline_s is None else deadline_s
    started = time.monotonic()
    results: list[CaseResult] = []
    with fuzz_environment(settings, device.type):
        pending: list[Case] = []
        index = first_case
        while time.monotonic() - started < deadline and (max_cases is None or len(results) < max_cases):
            if not pending:
                pending = make_cases(settings, seed, index, device.type)
                index += 1
            case = pending.pop(0)
            reset()
            result = _run_guarded(case, compiler, device, settings)
            if result.failed and control is not None:
                reset()
                result = with_control(result, control, device, settings)
            results.append(result)
            if result.failed:
                logger.warning(
                    "fuzz case %d of seed %d (%s) differs from eager: %s",
                    case.index,
                    seed,
                    case.profile,
                    "; ".join(f"call {m.call} {m.where}: {m.kind}" for m in result.mismatches[:3]),
                )
        reset()
    return summarize(settings, results, seed, device.type, deadline, time.monotonic() - started, first_case)


def with_control(
    result: CaseResult, control: Compiler, device: torch.device, settings: Settings
) -> CaseResult:
    """``result`` with what the same case gives under ``control`` (Note: [The control run])."""
    again = _run_guarded(result.case, control, device, settings)
    if again.eager_error is not None:
        return result
    first = again.mismatches[0] if again.mismatches else None
    described = f"call {first.call} {first.where}: {first.kind}: {first.detail}"[:300] if first else None
    return dataclasses.replace(result, control_mismatches=len(again.mismatches), control_first=described)


def _run_guarded(case: Case, compiler: Compiler, device: torch.device, settings: Settings) -> CaseResult:
    """``run_case``; an exception outside the calls (building the case, compiling it) fails the case
    instead of ending the run, so the cases after it still run and the record still gets written."""
    try:
        return run_case(case, compiler, device, settings)
    except Exception as exc:
        logger.exception("fuzz case %d of seed %d raised outside its calls", case.index, case.base_seed)
        detail = f"{type(exc).__name__}: {exc}"[:500]
        return CaseResult(case, 0, (Mismatch(-1, "case", MismatchKind.EXCEPTION.value, detail),))


def summarize(
    settings: Settings,
    results: list[CaseResult],
    seed: int,
    device_type: str,
    deadline: float,
    seconds: float,
    first_case: int = 0,
) -> FuzzSummary:
    failures, known, invalid = [], [], []
    for result in results:
        if result.eager_error is not None:
            invalid.append(result)
        elif result.failed:
            issue = settings.known_issue(seed, result.case.index, device_type)
            if issue is None:
                failures.append(result)
            else:
                known.append((result, issue))
    keep = settings.limits.max_failures_kept
    features: Counter[str] = Counter(f for r in results for f in r.case.model.features)
    return FuzzSummary(
        base_seed=seed,
        device=device_type,
        deadline_s=deadline,
        seconds=round(seconds, 3),
        cases=len(results),
        calls=sum(r.calls for r in results),
        mismatches=sum(len(r.mismatches) for r in results if r.eager_error is None),
        failures=tuple(failures[:keep]),
        known=tuple(known[:keep]),
        invalid=tuple(invalid[:keep]),
        profiles=dict(Counter(r.case.profile for r in results)),
        features=dict(features),
        first_case=first_case,
        failed_cases=len(failures),
        known_cases=len(known),
        invalid_cases=len(invalid),
    )
