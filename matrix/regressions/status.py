"""Status against expected: FAIL, IMPROVED, XFAIL, FLAKY, MISSING (and PASS, SKIP), per result.

Problem: a matrix over many PyTorch x Triton x CUDA cells always has known failures. A run must go red
when something that used to work breaks, stay green for known failures, and say when a known failure
got fixed so that the expectation is updated, the way PyTorch's expected-accuracy CSVs work.

Design: expectations are data (expected.toml, loaded into the ``ExpectedStatus`` table). Each names a
cell pattern, suite, workload and mode (fnmatch patterns), the expected status and whether the result is
flaky. A result with no matching expectation is expected to pass. The most specific matching entry
wins (most literal characters in cell, workload and mode; ties go to the later entry).

Verdicts, for one result with expected status E and actual status A:
- A == E: PASS if A is the suite's passing status, else XFAIL (a known failure).
- A != E and the entry is flaky: FLAKY. Never a failure, whatever ``fail_on`` says.
- A passes, E does not: IMPROVED (update the expectation).
- A is ``skip`` and no entry was written for the result: SKIP (a mode that has not landed, a CPU cell).
- otherwise: FAIL.
- expected explicitly (literal workload and mode, in a suite and mode this run ran), or present in the
  baseline run, yet absent from this run: MISSING (FLAKY for a flaky entry).

The ``tests`` suite (Note: [Every outcome reaches a verdict] in ``observations``) is judged the same way,
over ``bearing_verdicts``: a test that failed without recording the result that explains it is FAIL
(XFAIL where expected.toml names it), a run that did not complete is FAIL; nothing in it is MISSING.

Invariant: FLAKY is never in the failing set (thresholds refuse it).
"""

from __future__ import annotations

import enum
import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from matrix.regressions.observations import (
    PASSING_STATUS,
    RUN_SUBJECT,
    SKIP_STATUS,
    TEST_NOT_FAILED,
    Observation,
    ResultKey,
    Suite,
)


class Verdict(str, enum.Enum):
    PASS = "PASS"
    XFAIL = "XFAIL"
    FAIL = "FAIL"
    IMPROVED = "IMPROVED"
    FLAKY = "FLAKY"
    MISSING = "MISSING"
    SKIP = "SKIP"


@dataclass(frozen=True)
class Expectation:
    """One entry of expected.toml (one row of the ExpectedStatus table)."""

    cell_pattern: str
    suite: Suite
    workload: str
    mode: str
    status: str
    flaky: bool = False
    reason: str = ""

    def matches(self, cell_id: str, key: ResultKey) -> bool:
        return (
            key.suite == self.suite
            and fnmatch.fnmatchcase(cell_id, self.cell_pattern)
            and fnmatch.fnmatchcase(key.workload, self.workload)
            and fnmatch.fnmatchcase(key.mode, self.mode)
        )

    @property
    def literal(self) -> bool:
        """Names exactly one workload and mode, so its absence from a run means something is missing."""
        return not any(ch in s for s in (self.workload, self.mode) for ch in "*?[")

    @property
    def specificity(self) -> int:
        return sum(
            len(s) - sum(s.count(ch) for ch in "*?[]") for s in (self.cell_pattern, self.workload, self.mode)
        )


@dataclass(frozen=True)
class StatusFinding:
    cell_id: str
    key: ResultKey
    verdict: Verdict
    actual: str | None  # None when MISSING
    expected: str
    explicit: bool  # an expected.toml entry applied (False: the default "expected to pass")
    reason: str = ""  # the expectation's reason
    nodeid: str = ""
    message: str = ""  # what the test said (failure text), never trusted as markup


def expectation_for(expectations: Sequence[Expectation], cell_id: str, key: ResultKey) -> Expectation | None:
    best: Expectation | None = None
    for entry in expectations:
        if entry.matches(cell_id, key) and (best is None or entry.specificity >= best.specificity):
            best = entry
    return best


def judge_one(cell_id: str, observation: Observation, entry: Expectation | None) -> StatusFinding:
    key, actual = observation.key, observation.status
    passing = PASSING_STATUS[key.suite]
    expected = entry.status if entry else passing
    if actual == expected:
        verdict = Verdict.PASS if actual == passing else Verdict.XFAIL
    elif entry is not None and entry.flaky:
        verdict = Verdict.FLAKY
    elif actual == passing:
        verdict = Verdict.IMPROVED
    elif actual == SKIP_STATUS and entry is None:
        verdict = Verdict.SKIP
    else:
        verdict = Verdict.FAIL
    return StatusFinding(
        cell_id=cell_id,
        key=key,
        verdict=verdict,
        actual=actual,
        expected=expected,
        explicit=entry is not None,
        reason=entry.reason if entry else "",
        nodeid=observation.nodeid,
        message=observation.message,
    )


def merge_observations(observations: Iterable[Observation]) -> dict[ResultKey, Observation]:
    """One observation per key: a failing one wins over a skip, a skip over a pass (a test that
    recorded the same key twice and failed once has failed)."""

    def rank(o: Observation) -> int:
        if o.passing:
            return 0
        return 1 if o.status == SKIP_STATUS else 2

    merged: dict[ResultKey, Observation] = {}
    for obs in observations:
        current = merged.get(obs.key)
        if current is None or rank(obs) > rank(current):
            merged[obs.key] = obs
    return merged


def bearing_verdicts(observations: Iterable[Observation]) -> list[Observation]:
    """The observations that are judged (Note: [Every outcome reaches a verdict]): every result, and of
    the ``tests`` suite only the failures that no record of the test explains, and the run's end."""
    observations = list(observations)
    explained = {
        o.nodeid
        for o in observations
        if o.key.suite is not Suite.TESTS and not o.passing and o.status != SKIP_STATUS and o.nodeid
    }
    return [
        o
        for o in observations
        if o.key.suite is not Suite.TESTS
        or (o.status not in TEST_NOT_FAILED and o.nodeid not in explained)
        or o.key.workload == RUN_SUBJECT
    ]


def judge_run(
    cell_id: str,
    observations: Iterable[Observation],
    expectations: Sequence[Expectation],
    baseline_keys: Iterable[ResultKey] = (),
    suites: Iterable[Suite] | None = None,
) -> list[StatusFinding]:
    """Verdicts for every result of one run, plus MISSING for results expected (literally, or by being in
    the baseline run) but absent. ``suites`` limits MISSING to the suites this run was meant to run
    (default: the suites it produced results for, so a correctness-only run is not missing perf); an
    expectation is only missed in a mode the run produced results for (a CPU run of a cell is not
    missing a GPU mode's expected failure)."""
    merged = merge_observations(bearing_verdicts(observations))
    findings = [
        judge_one(cell_id, obs, expectation_for(expectations, cell_id, key)) for key, obs in merged.items()
    ]
    ran_suites = set(suites) if suites is not None else {key.suite for key in merged}
    ran_suites.discard(Suite.TESTS)  # a test that stops failing leaves no row: never MISSING
    wanted = {key for key in baseline_keys if key.suite in ran_suites}
    ran_modes = {(key.suite, key.mode) for key in merged}
    for entry in expectations:
        if (
            entry.literal
            and entry.suite in ran_suites
            and (entry.suite, entry.mode) in ran_modes
            and fnmatch.fnmatchcase(cell_id, entry.cell_pattern)
        ):
            wanted.add(ResultKey(entry.suite, entry.workload, entry.mode))
    for key in sorted(wanted - set(merged)):
        found = expectation_for(expectations, cell_id, key)
        if found is not None and found.status == SKIP_STATUS and not found.flaky:
            continue  # expected to be skipped; a skip that left no record is not missing
        findings.append(
            StatusFinding(
                cell_id=cell_id,
                key=key,
                verdict=Verdict.FLAKY if found is not None and found.flaky else Verdict.MISSING,
                actual=None,
                expected=found.status if found else PASSING_STATUS[key.suite],
                explicit=found is not None,
                reason=found.reason if found else "",
            )
        )
    findings.sort(key=lambda f: f.key)
    return findings


def failing(findings: Iterable[StatusFinding], fail_on: Iterable[str]) -> list[StatusFinding]:
    """The findings that count as regressions; FLAKY never does, whatever ``fail_on`` lists."""
    wanted = {Verdict(v) for v in fail_on} - {Verdict.FLAKY}
    return [f for f in findings if f.verdict in wanted]
