"""Correctness suite: every selected workload x mode gets one CorrectnessRecord.

Run: ``pytest suites/test_correctness.py --tier smoke`` (add ``-n auto --dist loadgroup`` to spread
workloads over processes; each workload's modes stay in one process so it is built once).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("torch", reason="the correctness suite needs torch (Triton-only cells run the PI checks)")

from suites.accuracy import load_tolerances
from suites.correctness import evaluate
from suites.harness import prepare, resolve_device
from suites.modes import Mode
from suites.options import SuiteOptions
from suites.records import CorrectnessStatus, Record
from suites.workloads import get

pytestmark = pytest.mark.correctness

TOLERANCES = load_tolerances()


def test_correctness(
    workload_name: str, mode: str, suite_options: SuiteOptions, grace_record: Callable[[Record], None]
) -> None:
    prepared = prepare(get(workload_name), suite_options.tier, resolve_device(suite_options.device))
    record, diagnostics = evaluate(prepared, Mode(mode), TOLERANCES)
    grace_record(record)
    for diagnostic in diagnostics:
        grace_record(diagnostic)
    if record.status is CorrectnessStatus.PASS:
        return
    if record.status in (CorrectnessStatus.SKIP, CorrectnessStatus.MODEL_FAIL_TO_LOAD) and record.details.get(
        "expected"
    ):
        pytest.skip(f"{record.status.value}: {record.reason}")
    pytest.fail(f"{record.status.value}: {record.reason}", pytrace=False)
