"""A TP results file (suites/tp/results.py) as suites records, and the verdict of the test that ran it.

Problem: a TP run writes one JSON file per workload and TP size; the matrix stores ``suites.records``
records. The mapping must keep every mode's status and reason, must not lose a failure that happened
outside the modes (the launch, the sharding check, the timing), and must keep one TP size's figures apart
from another's (a TP-2 median is not comparable with a TP-4 median).

Design: ``records_from_launch`` takes a ``suites.tp.launch.LaunchOutcome``. With results it calls
``records_from_results``: per mode one ``CorrectnessRecord`` and, for a run on CUDA, one
``PerformanceRecord``; without, ``launcher_failure_records``: one ``fail_to_run`` record per requested
mode, the reason the launch's. All return ``TPRecords``, which also carries the test's verdict: the
``problems`` that must fail it (after its records are emitted) and, where there is none and every mode
skipped, the ``skip_reason``. The stored workload is ``<workload>@tp<N>`` with the tag ``tp``, the tier
and code hash of the file.

Status mapping: a mode's status is the ``CorrectnessStatus`` of the same value (an unknown value is
``fail_to_run``, saying so); ``errors`` holds the figures of the deciding rank check (worst status, then
largest ``tol_ratio``); ``details`` the world size, backend, device, dtype, torch, what the mode ran as,
compile facts, per-rank errors and verdicts and the sharding and reference checks. Timing: ``ok`` with
the per-step samples (the slowest rank's sample of each step), their median and, in ``details``, the
speedups vs inductor and pt2cg of the same run and every rank's raw samples; ``fail_to_run`` (``OOM``
for an out-of-memory error) where timing a mode failed; ``skip`` with the reason otherwise.

Invariant: a problem is never only in ``details``: every failure status, a sharding or reference check
that did not pass, a failed timing and a launch problem each add one line to ``problems``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from suites.records import (
    CorrectnessRecord,
    CorrectnessStatus,
    PerformanceRecord,
    PerformanceStatus,
    Record,
    WorkloadRef,
)
from suites.tp.launch import LaunchOutcome

TAG = "tp"
_SEVERITY = {"pass": 0, "skip": 0, "fail_accuracy": 1}  # anything else: 2


@dataclass(frozen=True)
class TPRecords:
    """The records of one TP test and its verdict."""

    correctness: tuple[CorrectnessRecord, ...]
    performance: tuple[PerformanceRecord, ...] = ()
    problems: tuple[str, ...] = ()  # each fails the test

    @property
    def all(self) -> list[Record]:
        return [*self.correctness, *self.performance]

    @property
    def skip_reason(self) -> str | None:
        """Why the test skips: no problem and every mode skipped (the reasons, once each)."""
        if self.problems or not self.correctness:
            return None
        if any(r.status is not CorrectnessStatus.SKIP for r in self.correctness):
            return None
        return "; ".join(dict.fromkeys(f"{r.mode}: {r.reason}" for r in self.correctness))


def workload_ref(workload: str, world_size: int, tier: str, code_hash: str) -> WorkloadRef:
    """``xlnet_tp`` at TP-2 is stored as ``xlnet_tp@tp2``, tagged ``tp``."""
    return WorkloadRef(name=f"{workload}@tp{world_size}", tier=tier, tags=(TAG,), code_hash=code_hash)


def launcher_failure_records(
    ref: WorkloadRef, modes: Sequence[str], reason: str, details: Mapping[str, Any] | None = None
) -> TPRecords:
    """One ``fail_to_run`` record per mode: the launch gave no results (no gloo, timeout, bad JSON)."""
    records = tuple(
        CorrectnessRecord(
            workload=ref,
            mode=mode,
            status=CorrectnessStatus.FAIL_TO_RUN,
            reason=f"TP launch failed: {reason}",
            details={"launch": dict(details or {})},
        )
        for mode in modes
    )
    return TPRecords(records, problems=(f"TP launch failed: {reason}",))


def records_from_launch(outcome: LaunchOutcome, ref: WorkloadRef, modes: Sequence[str]) -> TPRecords:
    """The records of one launch: from its results, else one ``fail_to_run`` per mode in ``modes``.

    ``ref`` names the workload when there are no results (the results name it themselves)."""
    launch = {**outcome.details, "command": outcome.command}
    if outcome.data is None:
        return launcher_failure_records(ref, modes, outcome.problem or "no results", launch)
    return records_from_results(outcome.data, launch, outcome.problem)


def records_from_results(
    data: Mapping[str, Any], launch: Mapping[str, Any] | None = None, launch_problem: str | None = None
) -> TPRecords:
    """Records and verdict for one results dict (``read_results``): ``launch`` goes into every record's
    details, ``launch_problem`` (a run that wrote its results, then exited non-zero) fails the test."""
    workload = data["workload"]
    world_size = int(data["world_size"])
    ref = workload_ref(workload["name"], world_size, workload["tier"], workload.get("code_hash", ""))
    run = {
        "world_size": world_size,
        "backend": data.get("backend"),
        "device": data.get("device"),
        "dtype": data.get("dtype"),
        "torch": data.get("torch"),
        "size": workload.get("size", {}),
        **({"launch": dict(launch)} if launch else {}),
    }
    problems: list[str] = [launch_problem] if launch_problem else []
    for check in ("sharding", "reference"):
        verdict = data.get(check) or {}
        if verdict and verdict.get("status") != CorrectnessStatus.PASS.value:
            problems.append(f"{check} check: {verdict.get('status')}: {verdict.get('why')}")
    correctness = []
    for mode, result in data.get("modes", {}).items():
        record = _correctness(ref, mode, result, data, run)
        correctness.append(record)
        if record.status not in (CorrectnessStatus.PASS, CorrectnessStatus.SKIP):
            problems.append(f"{mode}: {record.status.value}: {record.reason}")
    performance: list[PerformanceRecord] = []
    if data.get("device") == "cuda":
        for mode, result in data.get("modes", {}).items():
            perf = _performance(ref, mode, result, data.get("timing") or {}, run)
            performance.append(perf)
            if perf.status in (PerformanceStatus.FAIL_TO_RUN, PerformanceStatus.OOM):
                problems.append(f"{mode} timing: {perf.status.value}: {perf.reason}")
    return TPRecords(tuple(correctness), tuple(performance), tuple(problems))


def _status(value: Any) -> tuple[CorrectnessStatus, str | None]:
    try:
        return CorrectnessStatus(value), None
    except ValueError:
        known = ", ".join(s.value for s in CorrectnessStatus)
        return CorrectnessStatus.FAIL_TO_RUN, f"unknown status {value!r} in the TP results (known: {known})"


def deciding_check(checks: Mapping[str, Sequence[Mapping[str, Any]]]) -> Mapping[str, Any] | None:
    """The rank check that decided a mode's verdict: worst status, then largest ``tol_ratio``."""

    def key(check: Mapping[str, Any]) -> tuple[int, float]:
        ratio = (check.get("figures") or {}).get("tol_ratio")
        return _SEVERITY.get(check.get("status", ""), 2), ratio if isinstance(ratio, int | float) else 0.0

    every = [check for per_set in checks.values() for check in per_set]
    return max(every, key=key) if every else None


def _correctness(
    ref: WorkloadRef, mode: str, result: Mapping[str, Any], data: Mapping[str, Any], run: Mapping[str, Any]
) -> CorrectnessRecord:
    status, unknown = _status(result.get("status"))
    checks = result.get("checks") or {}
    decided = deciding_check(checks)
    details = {
        **run,
        "runs_as": result.get("runs_as"),
        "compile_s": result.get("compile_s"),
        "compile_facts": result.get("compile_facts", {}),
        "rank_errors": result.get("errors", {}),
        "checks": {
            name: [{"rank": c.get("rank"), "status": c.get("status"), "why": c.get("why")} for c in per_set]
            for name, per_set in checks.items()
        },
        "deciding_check": None
        if decided is None
        else {"rank": decided.get("rank"), "why": decided.get("why")},
        "sharding": {k: (data.get("sharding") or {}).get(k) for k in ("status", "why")},
        "reference": {k: (data.get("reference") or {}).get(k) for k in ("status", "why")},
        **({"grace_graphs": result["grace_graphs"]} if result.get("grace_graphs") else {}),
    }
    reason = unknown or result.get("reason") or None
    return CorrectnessRecord(
        workload=ref,
        mode=mode,
        status=status,
        reason=reason,
        errors=dict(decided.get("figures") or {}) if decided is not None else {},
        tolerance=dict(data.get("tolerance") or {}) if decided is not None else {},
        details=details,
    )


def _performance(
    ref: WorkloadRef, mode: str, result: Mapping[str, Any], timing: Mapping[str, Any], run: Mapping[str, Any]
) -> PerformanceRecord:
    steps = [float(s) for s in (timing.get("step_ms") or {}).get(mode, [])]
    error = (timing.get("errors") or {}).get(mode)
    details = {
        **{k: run[k] for k in ("world_size", "backend", "device", "dtype", "torch") if k in run},
        "speedup_vs_inductor": (timing.get("speedup_vs_inductor") or {}).get(mode),
        "speedup_vs_pt2cg": (timing.get("speedup_vs_pt2cg") or {}).get(mode),
        "samples_ms_by_rank": (timing.get("samples_ms") or {}).get(mode, {}),
        "rule": timing.get("rule", ""),
        "runs_as": result.get("runs_as"),
    }
    if error:
        oom = "out of memory" in error.lower()
        status, reason = (PerformanceStatus.OOM if oom else PerformanceStatus.FAIL_TO_RUN), error
    elif steps:
        status, reason = PerformanceStatus.OK, None
    elif timing.get("status") != PerformanceStatus.OK.value:
        status, reason = PerformanceStatus.SKIP, timing.get("reason") or "not timed"
    else:
        status = PerformanceStatus.SKIP
        reason = f"not timed: {result.get('status')}: {result.get('reason')}"
    return PerformanceRecord(
        workload=ref,
        mode=mode,
        status=status,
        reason=reason,
        samples_ms=tuple(steps),
        median_ms=(timing.get("median_ms") or {}).get(mode) if steps else None,
        compile_s=result.get("compile_s"),
        details=details,
    )
