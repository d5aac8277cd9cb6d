"""The fuzz page's view: per run, the differential fuzzer's counts and its failing schedules.

Problem: a fuzz run is one correctness result of workload ``fuzz`` whose details hold the counts
(cases, calls compared, mismatches) and, per failing case, the replay command, the mismatches, the
model's source and the schedule (suites/fuzz/recording.py). The cell grid shows its verdict; a reader
also needs the counts and enough of each failure to replay it.

Design: ``fuzz_rows`` reads the fuzz results of the given logical runs with one column select and turns
each into a frozen ``FuzzRow`` (newest run first); schedules are pretty-printed JSON. A details format
newer than ``suites.fuzz.DETAILS_FORMAT`` is shown as such, never guessed at.

Invariants: no torch import; strings stay plain (the template escapes them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from matrix.readmodel import RunInfo
from matrix.statuses import row_status
from matrix.store.models import CorrectnessResult, Workload
from suites.fuzz import DETAILS_FORMAT, WORKLOAD

COUNTS = ("cases", "calls", "mismatches", "failed_cases", "known_cases", "invalid_cases")


@dataclass(frozen=True)
class FuzzFailure:
    replay: str
    profile: str
    mismatches: tuple[str, ...]
    source: str
    schedule: str
    issue: str = ""
    control: str = ""  # what Inductor alone gave on the case (suites.fuzz.session: the control run)


@dataclass(frozen=True)
class FuzzRow:
    run: RunInfo
    mode: str
    status: str
    counts: dict[str, int]
    seeds: str
    seconds: float | None
    failures: tuple[FuzzFailure, ...]
    known: tuple[FuzzFailure, ...]
    note: str = ""


def _failure(data: dict[str, Any]) -> FuzzFailure:
    mismatches = tuple(
        f"call {m.get('call')} {m.get('where')}: {m.get('kind')}: {m.get('detail')}"
        + (f" (max abs {m['max_abs']:.3g})" if isinstance(m.get("max_abs"), float) else "")
        for m in data.get("mismatches", [])
    )
    return FuzzFailure(
        replay=str(data.get("replay", "")),
        profile=str(data.get("profile", "")),
        mismatches=mismatches,
        source=str(data.get("source", "")),
        schedule=json.dumps(data.get("schedule", {}), indent=1, sort_keys=True),
        issue=str(data.get("issue", "")),
        control=_control(data.get("control")),
    )


def _control(data: Any) -> str:
    if not isinstance(data, dict) or not isinstance(data.get("mismatch_count"), int):
        return ""
    count, compiler = data["mismatch_count"], data.get("compiler", "the control")
    if count == 0:
        return f"{compiler} alone agrees with eager: the difference is grace's"
    return f"{compiler} alone differs from eager too ({count}): {data.get('first')}"


def _row(run: RunInfo, mode: str, status: str, errors: dict[str, Any], details: dict[str, Any]) -> FuzzRow:
    counts = {name: int(errors.get(name, 0) or 0) for name in COUNTS}
    fmt = details.get("format")
    if isinstance(fmt, int) and fmt > DETAILS_FORMAT:
        note = f"details format {fmt} is newer than this dashboard ({DETAILS_FORMAT}); upgrade grace-matrix"
        return FuzzRow(run, mode, status, counts, "-", None, (), (), note)
    cases = details.get("cases_run") or []
    seeds = f"seed {details.get('base_seed', '-')}"
    if len(cases) == 2:
        seeds += f", cases {cases[0]}-{cases[1]}"
    return FuzzRow(
        run=run,
        mode=mode,
        status=status,
        counts=counts,
        seeds=seeds,
        seconds=details.get("seconds"),
        failures=tuple(_failure(f) for f in details.get("failures", [])),
        known=tuple(_failure(f) for f in details.get("known", [])),
    )


def fuzz_rows(session: Session, runs: Sequence[RunInfo]) -> tuple[FuzzRow, ...]:
    """The fuzz results of ``runs`` (each logical run's member runs), newest run first."""
    by_pk = {pk: run for run in runs for pk in run.pks}
    if not by_pk:
        return ()
    stmt = (
        select(
            CorrectnessResult.run_pk,
            CorrectnessResult.mode,
            CorrectnessResult.status,
            CorrectnessResult.errors,
            CorrectnessResult.details,
        )
        .join(Workload, CorrectnessResult.workload_pk == Workload.id)
        .where(Workload.name == WORKLOAD, CorrectnessResult.run_pk.in_(list(by_pk)))
        .order_by(CorrectnessResult.id)
    )
    rows = [
        _row(
            by_pk[run_pk],
            mode,
            str(row_status(status, errors, details) or status),
            _mapping(errors),
            _mapping(details),
        )
        for run_pk, mode, status, errors, details in session.execute(stmt)
    ]
    return tuple(sorted(rows, key=lambda r: (r.run.started_at, r.run.pk), reverse=True))


def _mapping(value: object) -> dict[str, Any]:
    """A stored JSON object as a dict; {} for none, or for an unreadable one (its row reads unreadable)."""
    return dict(value) if isinstance(value, dict) else {}
