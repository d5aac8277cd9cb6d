"""Plain, store-independent values that regression detection works on.

Problem: detection must be unit-testable on synthetic histories without a database, and the dashboards
must render from exactly what detection saw.

Design: the loader (``matrix.regressions.loader``) turns store rows into these frozen dataclasses; the
detectors (``status``, ``pairwise``, ``history``) are pure functions over them.

Invariants:
- A ``ResultKey`` names one result within a run: suite, workload (a PI subject for the pi suite) and mode
  (a PI stage for the pi suite).
- ``CellKey`` groups runs whose performance may be compared: the same matrix cell id on the same GPU.
- A ``RunInfo`` may stand for a logical run (``matrix.regressions.logical``): several runs of one cell key
  sharing a label. ``members`` then lists their pks and uids, oldest first; ``pk`` and ``uid`` are those of
  the latest member, ``started_at`` that of the first. A plain run has no members.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NewType

CellKey = NewType("CellKey", str)


class Suite(str, enum.Enum):
    CORRECTNESS = "correctness"
    PERFORMANCE = "performance"
    PI = "pi"
    TESTS = "tests"  # pytest's own outcomes and the run's end (Note: [Every outcome reaches a verdict])


# The status each suite writes for a result that is fine; anything else is a failure except SKIP_STATUS.
PASSING_STATUS: dict[Suite, str] = {
    Suite.CORRECTNESS: "pass",
    Suite.PERFORMANCE: "ok",
    Suite.PI: "pass",
    Suite.TESTS: "passed",
}
SKIP_STATUS = "skip"

# Note: [Every outcome reaches a verdict]
# A test that fails or errors (in setup, call or teardown, or with its worker) before it records the
# result that explains it, and a run that did not end ``complete`` (crashed, stopped at its deadline,
# pytest refused to run), leave no correctness, performance or PI result that could fail. So the
# ``tests`` suite turns them into results: the loader gives one per test, keyed ``(tests, <node id>,
# pytest)`` with pytest's outcome as status, and one per run that did not complete, keyed ``(tests, <run>,
# pytest)`` with the run's status. Only failures are judged (``status.bearing_verdicts``), and a failed
# test only when none of its own records fails (that record carries the verdict, and expected.toml covers
# it as such); passed and skipped tests are what the suites' own results already say. expected.toml
# covers the rest like any result (suite "tests", workload a node id pattern or "<run>"). Absence is never
# MISSING in this suite: a test that stops failing leaves no row behind.
TEST_MODE = "pytest"
RUN_SUBJECT = "<run>"
TEST_FAILURES = frozenset({"failed", "error", "crashed"})


def cell_key(cell_id: str, gpu_name: str | None) -> CellKey:
    return CellKey(f"{cell_id}@{gpu_name or 'no-gpu'}")


@dataclass(frozen=True, order=True)
class ResultKey:
    suite: Suite
    workload: str
    mode: str

    def label(self) -> str:
        return f"{self.suite.value}:{self.workload}:{self.mode}"


@dataclass(frozen=True)
class RunInfo:
    """One run and the environment of its cell, as the dashboards and detectors need them."""

    pk: int
    uid: str
    cell_id: str
    cell_key: CellKey
    kind: str
    torch_version: str | None
    triton_version: str | None
    cuda_runtime: str | None
    gpu_name: str | None
    started_at: dt.datetime
    status: str
    label: str | None = None
    git_sha: str | None = None
    host: str | None = None
    message: str | None = None
    members: tuple[int, ...] = ()  # pks of the runs of a logical run, oldest first; () for a plain run
    member_uids: tuple[str, ...] = ()

    @property
    def pks(self) -> tuple[int, ...]:
        """The pks of the runs whose results this run holds, oldest first."""
        return self.members or (self.pk,)

    @property
    def uids(self) -> tuple[str, ...]:
        return self.member_uids or (self.uid,)

    @property
    def order(self) -> tuple[dt.datetime, int]:
        """Position in the history of its cell key (a logical run sits where its first member started)."""
        return (self.started_at, self.pks[0])

    @property
    def short_uid(self) -> str:
        return self.uid[:8]

    @property
    def display_name(self) -> str:
        """The cell as pages name it, unique per cell key: one id may run on several machines."""
        return f"{self.cell_id} ({self.gpu_name or 'no GPU'})"

    @property
    def short_sha(self) -> str:
        """The code the run ran (the commit, ``-dirty`` kept), shortened; "" when unknown."""
        sha = self.git_sha or ""
        dirty = sha.endswith("-dirty")
        return sha[:9] + ("-dirty" if dirty else "") if sha else ""

    @property
    def stack(self) -> str:
        torch, triton, cuda = self.torch_version or "-", self.triton_version or "-", self.cuda_runtime or "-"
        return f"torch {torch} / triton {triton} / CUDA {cuda}"


@dataclass(frozen=True)
class Observation:
    """The status of one result of one run, with the pytest node id and the message that explains it."""

    key: ResultKey
    status: str
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
