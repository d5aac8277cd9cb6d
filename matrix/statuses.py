"""The status of a stored result, as every reader of the store gets it: one enum.

Problem: the store keeps each result's status as text (what the suites, the recorder and older or
newer versions of grace-matrix wrote, or what an export someone edited says). Readers that compare that
text with literals of their own drift apart, and a status nobody knows slips through comparisons
unnoticed (neither passing nor skipped nor a known failure).

Design: ``ResultStatus`` lists every status a writer of this version uses: the correctness and
performance statuses of the suites (``suites.records``), the PI stage statuses (``grace.pi_contract``),
pytest's outcomes (the recorder's test outcomes) and how a run ends (``matrix.store.models.RunStatus``).
``read_status`` turns stored text into a member at the read boundary (the regressions' loader, the
report); text it does not know becomes ``OTHER``, which is never passing and never a skip, so it is
judged a failure everywhere. ``row_status`` reads a whole row's status: ``UNREADABLE`` when one of its
values reads as a ``matrix.unreadable.Unreadable`` marker (a latency of zero, samples that are not
numbers), judged a failure like ``OTHER``. Members print as their stored value, so pages and tables show
"pass", not the member's name. A test keeps the enum equal to the writers' vocabularies.

Invariant: ``read_status(s) == s`` for every status a writer of this version records; any other text
reads as ``OTHER``; a row holding a marker reads as ``UNREADABLE``, whatever its status text.
"""

from __future__ import annotations

import enum

from matrix.unreadable import Unreadable


class StoredText(str, enum.Enum):
    """An enum of texts the store keeps: a member prints as its stored value (Python 3.11 would print
    ``Class.NAME``), in text, templates and format specs alike."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class ResultStatus(StoredText):
    PASS = "pass"  # correctness, PI stage
    OK = "ok"  # performance
    SKIP = "skip"
    FAIL = "fail"  # PI stage
    FAIL_ACCURACY = "fail_accuracy"
    FAIL_TO_RUN = "fail_to_run"
    EAGER_FAIL_TO_RUN = "eager_fail_to_run"
    MODEL_FAIL_TO_LOAD = "model_fail_to_load"
    OOM = "OOM"
    PASSED = "passed"  # pytest outcomes of a test
    SKIPPED = "skipped"
    FAILED = "failed"  # a test's outcome, or a run that could not start its suites
    ERROR = "error"
    CRASHED = "crashed"  # a test's worker, or a whole run
    INSTALL_FAILED = "install_failed"  # a run whose environment could not be built
    RUNNING = "running"  # a run's end not recorded (yet)
    COMPLETE = "complete"
    OTHER = "other"  # text no writer of this version records: judged a failure
    UNREADABLE = "unreadable"  # a row holding a value no reader can use (matrix.unreadable): a failure


TEST_OUTCOMES = (
    ResultStatus.PASSED,
    ResultStatus.SKIPPED,
    ResultStatus.FAILED,
    ResultStatus.ERROR,
    ResultStatus.CRASHED,
)
"""The outcomes of a test the recorder writes (``matrix.recorder``); the store's column declares them."""

_BY_VALUE = {member.value: member for member in ResultStatus}


def read_status(text: str | None) -> ResultStatus | None:
    """The member for stored ``text`` (None stays None: no result)."""
    if text is None:
        return None
    return _BY_VALUE.get(text, ResultStatus.OTHER)


def row_status(text: str | None, *values: object) -> ResultStatus | None:
    """The status of a stored result row whose status text is ``text`` and whose other ``values`` are as
    its column types read them: ``UNREADABLE`` when one is an ``Unreadable`` marker, else
    ``read_status(text)``."""
    if any(isinstance(value, Unreadable) for value in values):
        return ResultStatus.UNREADABLE
    return read_status(text)
