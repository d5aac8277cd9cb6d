"""matrix.statuses: the one enum readers get for a stored result's status."""

from __future__ import annotations

from matrix.recorder import _RANK
from matrix.regressions.observations import Observation, ResultKey, Suite
from matrix.regressions.status import Verdict, judge_one
from matrix.statuses import TEST_OUTCOMES, ResultStatus, read_status
from matrix.store.models import RunStatus
from suites.records import CorrectnessStatus, PerformanceStatus, StageStatus


def test_every_status_a_writer_records_reads_as_itself() -> None:
    written = [
        *(s.value for s in CorrectnessStatus),
        *(s.value for s in PerformanceStatus),
        *(s.value for s in StageStatus),
        *(s.value for s in RunStatus),
        *_RANK,  # the recorder's pytest outcomes
    ]
    for text in written:
        status = read_status(text)
        assert status is not None and status is not ResultStatus.OTHER and status == text, text


def test_the_declared_test_outcomes_are_the_recorders() -> None:
    assert {o.value for o in TEST_OUTCOMES} == set(_RANK)


def test_unknown_text_is_other_and_judged_a_failure() -> None:
    assert read_status(None) is None
    for text in ("PASS", "passed ", "<script>", "fail_numeric"):
        status = read_status(text)
        assert status is ResultStatus.OTHER
        observation = Observation(ResultKey(Suite.CORRECTNESS, "mlp", "grace"), status)
        assert not observation.passing
        assert judge_one("torch-2.13", observation, None).verdict is Verdict.FAIL


def test_members_print_as_stored() -> None:
    assert f"{ResultStatus.FAIL_ACCURACY}" == "fail_accuracy" and str(ResultStatus.OOM) == "OOM"
    assert f"[{ResultStatus.OK:>4}]" == "[  ok]"
