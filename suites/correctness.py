"""The correctness suite's logic: one workload x mode -> one ``CorrectnessRecord`` (+ diagnostics).

Steps, as PyTorch's dynamo runner does them: the model must load (else ``model_fail_to_load``); eager
must run (else ``eager_fail_to_run``) and two eager runs must agree (else ``fail_accuracy``: nothing can
be judged against a moving reference); a float64 run is the reference of last resort. A compiled mode
is judged on its warmed-up call (for graph modes: a replay) against eager with ``accuracy.judge``; then,
for every compiled mode, it runs again on inputs with new values at new addresses and once more on the
original ones, because a graph that kept stale input pointers only shows itself there. Grace modes
also record CGCT diagnoses (``grace.explain``) and the grace.stats facts of their graphs.

Invariant: every path returns a record; errors become statuses, never exceptions.
"""

from __future__ import annotations

import copy
import importlib
import logging
from typing import Any

import torch

from suites import grace_stats
from suites.accuracy import Figures, ToleranceTable, compare, judge, judge_moved
from suites.harness import CompiledMode, Failure, PreparedWorkload, describe, failure_of
from suites.modes import GRACE_MODES, SPECS, Mode, override_details
from suites.records import CorrectnessRecord, CorrectnessStatus, DiagnosticRecord
from suites.tensors import Leaves, clone_inputs, variant_inputs

logger = logging.getLogger(__name__)


def _record(prepared: PreparedWorkload, mode: Mode, status: CorrectnessStatus, reason: str | None, **kw: Any):
    return CorrectnessRecord(
        workload=prepared.workload.ref(prepared.tier), mode=mode.value, status=status, reason=reason, **kw
    )


def _failed(prepared: PreparedWorkload, mode: Mode, failure: Failure, prefix: str = "") -> CorrectnessRecord:
    return _record(
        prepared, mode, failure.status, prefix + failure.reason, details={"expected": failure.expected}
    )


def evaluate(
    prepared: PreparedWorkload, mode: Mode, tolerances: ToleranceTable
) -> tuple[CorrectnessRecord, list[DiagnosticRecord]]:
    if prepared.load_failure is not None:
        return _failed(prepared, mode, prepared.load_failure), []
    eager = prepared.eager()
    if isinstance(eager, Failure):
        return _failed(prepared, mode, eager, prefix="eager: "), []
    first, second = eager
    dtype = str(prepared.dtype).removeprefix("torch.")
    tol = tolerances.for_(dtype, prepared.workload.name)
    rerun_tol = tolerances.rerun()
    rerun = compare(second, first, rerun_tol)
    rerun_status, rerun_why = judge(rerun, rerun_tol)
    fp64 = prepared.fp64()
    fp64_leaves = fp64 if isinstance(fp64, list) else None
    details: dict[str, Any] = {
        "dtype": dtype,
        "device": str(prepared.device),
        "fp64_reference": "available" if fp64_leaves is not None else fp64,
        "eager_rerun": rerun.to_dict(),
    }
    if rerun_status is not CorrectnessStatus.PASS:
        return _record(
            prepared,
            mode,
            CorrectnessStatus.FAIL_ACCURACY,
            f"eager_two_runs_differ: {rerun_why}",
            errors=rerun.to_dict(),
            tolerance=rerun_tol.to_dict(),
            details=details,
        ), []
    if mode is Mode.EAGER:
        return _judge_eager(prepared, first, fp64_leaves, tol, details), []
    entry = prepared.compiled_mode(mode)
    if entry.failure is not None or entry.fn is None:
        return _failed(
            prepared, mode, entry.failure or Failure(CorrectnessStatus.FAIL_TO_RUN, "not compiled")
        ), []
    details.update(_mode_details(entry))
    try:
        result = prepared.run(entry.fn, entry.inputs)
    except Exception as exc:
        return _failed(prepared, mode, failure_of(exc)), []
    figures = compare(result, first, tol, fp64_leaves)
    status, why = judge(figures, tol)
    moved_status, moved_why, moved = _moved_inputs_check(prepared, entry, first, figures, tol)
    details["moved_inputs"] = moved
    if status is CorrectnessStatus.PASS and moved_status is not CorrectnessStatus.PASS:
        status, why = moved_status, f"after inputs moved to new addresses: {moved_why}"
    diagnostics = _diagnose(prepared, mode, entry, details) if mode in GRACE_MODES else []
    record = _record(
        prepared, mode, status, why, errors=figures.to_dict(), tolerance=tol.to_dict(), details=details
    )
    return record, diagnostics


def _judge_eager(
    prepared: PreparedWorkload, first: Leaves, fp64: Leaves | None, tol: Any, details: dict[str, Any]
) -> CorrectnessRecord:
    """Eager is the reference: it passes when it runs and repeats itself; its float64 error is kept."""
    errors: dict[str, Any] = {}
    reason = "eager runs agree"
    if fp64 is not None:
        figures = compare(first, fp64, tol)
        errors = figures.to_dict()
        verdict, why = judge(figures, tol)
        reason += f"; against float64 ({verdict.value}): {why}"
        if figures.nan_count:
            return _record(
                prepared,
                Mode.EAGER,
                CorrectnessStatus.FAIL_ACCURACY,
                f"eager output has NaN: {why}",
                errors=errors,
                tolerance=tol.to_dict(),
                details=details,
            )
    return _record(
        prepared,
        Mode.EAGER,
        CorrectnessStatus.PASS,
        reason,
        errors=errors,
        tolerance=tol.to_dict(),
        details=details,
    )


def _mode_details(entry: CompiledMode) -> dict[str, Any]:
    return {
        "uses_graphs": SPECS[entry.mode].uses_graphs,
        "compile_s": entry.compile_s,
        "peak_mem_bytes": entry.peak_mem_bytes,
        "calls_peak_mem_bytes": entry.calls_peak_mem_bytes,
        "resident_mem_bytes": entry.resident_mem_bytes,
        **({"compile_facts": entry.compile_facts} if entry.compile_facts else {}),
        **override_details(entry.mode),
    }


def _moved_inputs_check(
    prepared: PreparedWorkload, entry: CompiledMode, eager_first: Leaves, original: Figures, tol: Any
) -> tuple[CorrectnessStatus, str, dict[str, Any]]:
    """Run on new values at new addresses, then on the original inputs again; both must match eager."""
    assert entry.fn is not None
    try:
        make_variant = prepared.workload.variant or variant_inputs
        moved_inputs = make_variant(clone_inputs(prepared.inputs))
        eager_moved = prepared.run(prepared.model, clone_inputs(moved_inputs))
        moved_result = prepared.run(entry.fn, moved_inputs)
        back_result = prepared.run(entry.fn, entry.inputs)
    except Exception as exc:
        failure = failure_of(exc)
        return failure.status, failure.reason, {"status": failure.status.value, "reason": failure.reason}
    moved = compare(moved_result, eager_moved, tol)
    back = compare(back_result, eager_first, tol)
    checks = {
        "moved": (moved, judge_moved(moved, original, tol)),
        "back": (back, judge_moved(back, original, tol)),
    }
    info: dict[str, Any] = {
        name: {"status": v[0].value, "reason": v[1], "errors": f.to_dict()} for name, (f, v) in checks.items()
    }
    for name, (_, (status, why)) in checks.items():
        if status is not CorrectnessStatus.PASS:
            label = "new inputs" if name == "moved" else "original inputs again"
            info["status"] = status.value
            return status, f"{label}: {why}", info
    info["status"] = CorrectnessStatus.PASS.value
    return CorrectnessStatus.PASS, "matches eager", info


def _diagnose(
    prepared: PreparedWorkload, mode: Mode, entry: CompiledMode, details: dict[str, Any]
) -> list[DiagnosticRecord]:
    """grace.stats facts for this mode's graphs, and (once per workload) grace.explain's diagnoses."""
    details["grace_stats"] = grace_stats.select(grace_stats.snapshot(), entry.grace_keys)
    if prepared.diagnosed:
        return []
    prepared.diagnosed = True
    try:
        grace: Any = importlib.import_module("grace")
        with torch.no_grad():
            report = grace.explain(copy.deepcopy(prepared.model), *clone_inputs(prepared.inputs))
    except Exception as exc:
        details["explain_error"] = describe(exc, 500)
        return []
    ref = prepared.workload.ref(prepared.tier)
    records = []
    for diagnosis in getattr(report, "diagnoses", ()) or ():
        code = getattr(diagnosis, "code", "unknown")
        effect = getattr(diagnosis, "effect", "")
        records.append(
            DiagnosticRecord(
                workload=ref,
                mode=mode.value,
                code=str(getattr(code, "value", code)),
                node=str(getattr(diagnosis, "node", "") or ""),
                source=str(getattr(diagnosis, "source", "") or ""),
                message=str(getattr(diagnosis, "message", "") or ""),
                transformed=bool(getattr(diagnosis, "transformed", False)),
                effect=str(getattr(effect, "value", effect) or ""),
            )
        )
    return records
