"""Plain, store-independent values that regression detection works on.

Problem: detection must be unit-testable on synthetic histories without a database, and the dashboards
must render from exactly what detection saw.

Design: the loader (``matrix.regressions.loader``) turns store rows into these frozen dataclasses; the
detectors (``status``, ``pairwise``, ``history``) are pure functions over them.

Invariants:
- A ``ResultKey`` names one result within a run: suite, workload (a PI subject for the pi suite) and mode
  (a PI stage for the pi suite).
- Runs are named by ``matrix.readmodel.RunInfo`` (one cell key per matrix cell id on one GPU; a logical
  run lists its members), as every reader of the store names them.
"""

from __future__ import annotations

import enum
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from matrix.statuses import ResultStatus


class Suite(str, enum.Enum):
    CORRECTNESS = "correctness"
    PERFORMANCE = "performance"
    PI = "pi"
    TESTS = "tests"  # pytest's own outcomes and the run's end (Note: [Every outcome reaches a verdict])


# The status each suite writes for a result that is fine; anything else is a failure except SKIP_STATUS.
PASSING_STATUS: dict[Suite, ResultStatus] = {
    Suite.CORRECTNESS: ResultStatus.PASS,
    Suite.PERFORMANCE: ResultStatus.OK,
    Suite.PI: ResultStatus.PASS,
    Suite.TESTS: ResultStatus.PASSED,
}
SKIP_STATUS = ResultStatus.SKIP

# Note: [Every outcome reaches a verdict]
# A test that fails or errors (in setup, call or teardown, or with its worker) before it records the
# result that explains it, and a run that did not end ``complete`` (crashed, stopped at its deadline,
# pytest refused to run), leave no correctness, performance or PI result that could fail. So the
# ``tests`` suite turns them into results: the loader gives one per test, keyed ``(tests, <node id>,
# pytest)`` with pytest's outcome as status, and one per run that did not complete, keyed ``(tests, <run>,
# pytest)`` with the run's status. Only failures are judged (``status.bearing_verdicts``: every outcome
# but passed and skipped, an outcome row that reads as unreadable included), and a failed
# test only when none of its own records fails (that record carries the verdict, and expected.toml covers
# it as such); passed and skipped tests are what the suites' own results already say. expected.toml
# covers the rest like any result (suite "tests", workload a node id pattern or "<run>"). Absence is never
# MISSING in this suite: a test that stops failing leaves no row behind.
TEST_MODE = "pytest"
RUN_SUBJECT = "<run>"
NO_TESTS_EXIT = 5  # pytest's exit code when it collected no test: a complete run that ran nothing
EMPTY_RUN = "the run collected no test (pytest exit code 5): it checked nothing"
TEST_FAILURES = frozenset({ResultStatus.FAILED, ResultStatus.ERROR, ResultStatus.CRASHED})
TEST_NOT_FAILED = frozenset({ResultStatus.PASSED, ResultStatus.SKIPPED})  # every other outcome is judged


@dataclass(frozen=True, order=True)
class ResultKey:
    suite: Suite
    workload: str
    mode: str

    def label(self) -> str:
        return f"{self.suite.value}:{self.workload}:{self.mode}"


@dataclass(frozen=True)
class Observation:
    """The status of one result of one run, with the pytest node id and the message that explains it."""

    key: ResultKey
    status: ResultStatus  # read from the stored text (matrix.statuses.read_status)
    nodeid: str = ""
    message: str = ""

    @property
    def passing(self) -> bool:
        return self.status == PASSING_STATUS[self.key.suite]


@dataclass(frozen=True)
class PerfSample:
    """Raw latency samples (ms) of one workload x mode in one run."""

    workload: str
    mode: str
    samples_ms: tuple[float, ...]
    median_ms: float
    nodeid: str = ""
    code_hash: str = ""

    @classmethod
    def from_samples(
        cls, workload: str, mode: str, samples: Sequence[float], nodeid: str = "", code_hash: str = ""
    ) -> PerfSample:
        values = tuple(float(v) for v in samples)
        return cls(workload, mode, values, statistics.median(values), nodeid, code_hash)


def natural_key(text: str) -> tuple[Any, ...]:
    """Sort "torch-2.9" before "torch-2.10": digit runs compare as numbers."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text))
