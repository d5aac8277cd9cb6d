"""A fuzz run as a suite record: workload ``fuzz``, the run's counts and every failing schedule.

Problem: the store, its exports and the dashboard must show what the fuzzer did (seeds, cases, calls
compared, mismatches) and, for each failure, what it takes to replay it, through the suites' one record
contract (suites/records.py) and without a schema of its own.

Design: ``to_record`` makes one ``CorrectnessRecord`` of workload ``fuzz`` (tag ``fuzz``, the hash of
the fuzzer's sources and settings as code hash) in the grace mode of the device (``grace`` on CUDA,
``grace-cpu`` without), so the fuzz verdict counts where grace's backend verdicts count. Status ``pass``
when no case failed outside the known list, else ``fail_accuracy`` when every failure is a difference
in values and ``fail_to_run`` when grace raised. ``errors`` holds the counts (numbers only, as the
store's errors are), ``details`` the seeds, the profiles and features covered, and per failing case its
replay command, mismatches, model source and schedule (JSON), and what the control run (Inductor alone)
gave on it.

Invariant: ``details["format"]`` is ``suites.fuzz.DETAILS_FORMAT``; readers (the dashboard) refuse a
newer one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from suites.fuzz import DETAILS_FORMAT, WORKLOAD
from suites.fuzz.compare import MismatchKind
from suites.fuzz.execute import CaseResult
from suites.fuzz.session import FuzzSummary
from suites.records import CorrectnessRecord, CorrectnessStatus, WorkloadRef

MISMATCHES_KEPT = 10


def fuzz_code_hash() -> str:
    """sha256 (16 hex digits) over the fuzzer's modules and fuzz.toml: a change of generator, schedule
    or settings is a change of the workload."""
    digest = hashlib.sha256()
    here = Path(__file__).parent
    for path in sorted([*here.glob("*.py"), *here.glob("*.toml")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def replay_command(result: CaseResult, device: str) -> str:
    case = result.case
    return (
        f"python -m suites.fuzz --seed {case.base_seed} --case {case.index} --profile {case.profile} "
        f"--device {device}"
    )


def case_details(result: CaseResult, device: str, issue: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "seed": result.case.base_seed,
        "case": result.case.index,
        "profile": result.case.profile,
        "options": dict(result.case.options),
        "replay": replay_command(result, device),
        "calls": result.calls,
        "mismatches": [m.to_dict() for m in result.mismatches[:MISMATCHES_KEPT]],
        "mismatch_count": len(result.mismatches),
        "source": result.case.model.source,
        "features": list(result.case.model.features),
        "schedule": result.case.schedule.to_dict(),
    }
    if result.control_mismatches is not None:
        data["control"] = {
            "compiler": "inductor",
            "mismatch_count": result.control_mismatches,
            "first": result.control_first,
        }
    if result.eager_error is not None:
        data["eager_error"] = result.eager_error
    if issue is not None:
        data["issue"] = issue
    return data


def _status(summary: FuzzSummary) -> tuple[CorrectnessStatus, str | None]:
    if not summary.failed_cases:
        return CorrectnessStatus.PASS, None
    raised = any(m.kind == MismatchKind.EXCEPTION.value for r in summary.failures for m in r.mismatches)
    first = summary.failures[0]
    reason = (
        f"{summary.failed_cases} of {summary.cases} fuzz cases differ from eager "
        f"({summary.mismatches} mismatches); first: {replay_command(first, summary.device)}"
    )
    return (CorrectnessStatus.FAIL_TO_RUN if raised else CorrectnessStatus.FAIL_ACCURACY), reason


def to_record(summary: FuzzSummary, mode: str, tier: str) -> CorrectnessRecord:
    status, reason = _status(summary)
    errors = {
        "cases": float(summary.cases),
        "calls": float(summary.calls),
        "mismatches": float(summary.mismatches),
        "failed_cases": float(summary.failed_cases),
        "known_cases": float(summary.known_cases),
        "invalid_cases": float(summary.invalid_cases),
    }
    details = {
        "format": DETAILS_FORMAT,
        "base_seed": summary.base_seed,
        "cases_run": [summary.first_case, summary.first_case + summary.cases - 1] if summary.cases else [],
        "device": summary.device,
        "deadline_s": summary.deadline_s,
        "seconds": summary.seconds,
        "profiles": summary.profiles,
        "features": summary.features,
        "failures": [case_details(r, summary.device) for r in summary.failures],
        "known": [case_details(r, summary.device, issue) for r, issue in summary.known],
        "invalid": [case_details(r, summary.device) for r in summary.invalid],
    }
    workload = WorkloadRef(WORKLOAD, tier, ("fuzz",), fuzz_code_hash())
    return CorrectnessRecord(workload, mode, status, reason, errors=errors, details=details)
