"""The correctness suite's logic: one workload x mode -> one ``CorrectnessRecord`` (+ diagnostics).

Steps, as PyTorch's dynamo runner does them: the model must load (else ``model_fail_to_load``); eager
must run (else ``eager_fail_to_run``) and two eager runs must agree (else ``fail_accuracy``: nothing can
be judged against a moving reference); a float64 run is the reference of last resort. A compiled mode
is judged on its warmed-up call (for graph modes: a replay) against eager with ``accuracy.judge``; then,
for every compiled mode, it runs again on inputs with new values at new addresses and once more on the
original ones, because a graph that kept stale input pointers only shows itself there. Grace modes
also record CGCT diagnoses (``grace.explain``) and the grace.stats facts of their graphs.

Training workloads (suites.training) are judged differently: from the same initial state and inputs,
eager float32 and the mode each run ``CHECK_STEPS`` training steps; each step's loss, the last step's
gradients and the final parameters are compared per quantity (tolerances' ``[training]`` section), each
also against a float64 run where one fits on the device. The eager record passes when its steps run
without NaN (its float64 figures are kept); eager's repeatability is not re-checked (a backward may
use atomics). Moved inputs are not re-checked: a training step's graphs are replayed on the same inputs.

Invariant: every path returns a record; errors become statuses, never exceptions.
"""

from __future__ import annotations

import copy
import importlib
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from suites import grace_stats
from suites.accuracy import Figures, ToleranceTable, compare, judge, judge_moved
from suites.harness import CompiledMode, Failure, PreparedWorkload, describe, failure_of
from suites.modes import GRACE_MODES, SPECS, Mode, override_details
from suites.records import CorrectnessRecord, CorrectnessStatus, DiagnosticRecord
from suites.tensors import Leaves, clone_inputs, to_float64, variant_inputs
from suites.training import CHECK_STEPS, TrainStep, TrainTrace, initial_state, is_training, run_trace

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
    if is_training(prepared.workload):
        return _evaluate_training(prepared, mode, tolerances), []
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
        "calls_peak_reserved_bytes": entry.calls_peak_reserved_bytes,
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


def _reference_trace(prepared: PreparedWorkload, float64: bool) -> TrainTrace:
    """Eager steps on a fresh copy of the workload's model (in float64 when asked)."""
    model, inputs = copy.deepcopy(prepared.model), clone_inputs(prepared.inputs)
    if float64:
        model, inputs = model.double(), to_float64(inputs)
    return run_trace(TrainStep(Mode.EAGER, model, prepared.device.type), inputs)


def _training_references(prepared: PreparedWorkload) -> tuple[TrainTrace | Failure, TrainTrace | str]:
    """Eager float32's trace and float64's (or why there is none), computed once per workload."""
    cache = prepared.training_cache
    if "eager" not in cache:
        cache["initial"] = initial_state(prepared.model)
        try:
            cache["eager"] = _reference_trace(prepared, float64=False)
        except Exception as exc:
            cache["eager"] = failure_of(exc, CorrectnessStatus.EAGER_FAIL_TO_RUN)
        try:
            cache["fp64"] = _reference_trace(prepared, float64=True)
        except Exception as exc:
            cache["fp64"] = f"no float64 reference: {describe(exc, 300)}"
        if prepared.device.type == "cuda":
            torch.cuda.empty_cache()
    return cache["eager"], cache["fp64"]


@dataclass(frozen=True)
class TraceVerdict:
    """The verdict on a training trace: the first failing quantity decides (else the one closest to
    its tolerance), ``per_quantity`` keeps every quantity's status, reason, errors and tolerance."""

    status: CorrectnessStatus
    reason: str
    quantity: str
    per_quantity: dict[str, Any]

    @property
    def errors(self) -> dict[str, float]:
        return dict(self.per_quantity[self.quantity]["errors"])

    @property
    def tolerance(self) -> dict[str, float]:
        return dict(self.per_quantity[self.quantity]["tolerance"])


def _judge_trace(
    result: TrainTrace, reference: TrainTrace, fp64: TrainTrace | None, dtype: str, tolerances: ToleranceTable
) -> TraceVerdict:
    """Per quantity (loss, grad, param): figures against ``reference`` (and ``fp64``) and a verdict."""
    per_quantity: dict[str, Any] = {}
    failed: tuple[str, CorrectnessStatus, str] | None = None
    closest, closest_ratio = "loss", -1.0
    for quantity, leaves in result.quantities().items():
        tol = tolerances.for_training(quantity, dtype)
        fp64_leaves = fp64.quantities()[quantity] if fp64 is not None else None
        figures = compare(leaves, reference.quantities()[quantity], tol, fp64_leaves)
        status, why = judge(figures, tol)
        errors = {k: v for k, v in figures.to_dict().items() if v is not None}
        per_quantity[quantity] = {
            "status": status.value, "reason": why, "errors": errors, "tolerance": tol.to_dict()
        }  # fmt: skip
        if failed is None and status is not CorrectnessStatus.PASS:
            failed = (quantity, status, f"{quantity}: {why}")
        ratio = math.inf if math.isnan(figures.tol_ratio) else figures.tol_ratio
        if ratio > closest_ratio:
            closest, closest_ratio = quantity, ratio
    if failed is not None:
        return TraceVerdict(failed[1], failed[2], failed[0], per_quantity)
    why = f"loss, gradients and parameters after {CHECK_STEPS} steps match the reference"
    return TraceVerdict(CorrectnessStatus.PASS, why, closest, per_quantity)


def _losses(trace: TrainTrace) -> list[float]:
    return [float(t) for _, t in trace.loss]


def _evaluate_training(
    prepared: PreparedWorkload, mode: Mode, tolerances: ToleranceTable
) -> CorrectnessRecord:
    eager, fp64 = _training_references(prepared)
    if isinstance(eager, Failure):
        return _failed(prepared, mode, eager, prefix="eager: ")
    # under autocast the forward computes in the autocast dtype: its tolerances apply
    dtype = getattr(prepared.model, "autocast", None) or str(prepared.dtype).removeprefix("torch.")
    fp64_trace = fp64 if isinstance(fp64, TrainTrace) else None
    details: dict[str, Any] = {
        "dtype": dtype,
        "device": str(prepared.device),
        "training_steps": CHECK_STEPS,
        "fp64_reference": "available" if fp64_trace is not None else fp64,
        "random": "dropout on; generator seeded before every step; inductor fallback_random",
    }
    details["eager_losses"] = _losses(eager)
    if mode is Mode.EAGER:
        return _judge_eager_training(prepared, eager, fp64_trace, dtype, tolerances, details)
    entry = prepared.compiled_mode(mode)
    if entry.failure is not None or not isinstance(entry.fn, TrainStep):
        return _failed(
            prepared, mode, entry.failure or Failure(CorrectnessStatus.FAIL_TO_RUN, "not compiled")
        )
    details.update(_mode_details(entry), **entry.fn.details())
    try:
        entry.fn.restore(prepared.training_cache["initial"])
        result = run_trace(entry.fn, entry.inputs)
    except Exception as exc:
        return _failed(prepared, mode, failure_of(exc))
    verdict = _judge_trace(result, eager, fp64_trace, dtype, tolerances)
    details.update(losses=_losses(result), training=verdict.per_quantity)
    if mode in GRACE_MODES:
        details["grace_stats"] = grace_stats.select(grace_stats.snapshot(), entry.grace_keys)
    return _record(
        prepared, mode, verdict.status, verdict.reason, errors=verdict.errors, tolerance=verdict.tolerance,
        details=details,
    )  # fmt: skip


def _judge_eager_training(
    prepared: PreparedWorkload,
    eager: TrainTrace,
    fp64: TrainTrace | None,
    dtype: str,
    tolerances: ToleranceTable,
    details: dict[str, Any],
) -> CorrectnessRecord:
    """Eager is the reference: it passes when its steps run without a NaN loss; its float64 figures
    are kept (and named in the reason) but do not decide."""
    errors: dict[str, float] = {}
    tolerance: dict[str, float] = {}
    reason = "eager steps ran"
    if fp64 is not None:
        verdict = _judge_trace(eager, fp64, None, dtype, tolerances)
        details["training"] = verdict.per_quantity
        errors, tolerance = verdict.errors, verdict.tolerance
        reason += f"; against float64 ({verdict.status.value}): {verdict.reason}"
    status = CorrectnessStatus.PASS
    if any(bool(torch.isnan(t).any()) for _, t in eager.loss):
        status, reason = CorrectnessStatus.FAIL_ACCURACY, f"eager loss is NaN; {reason}"
    return _record(prepared, Mode.EAGER, status, reason, errors=errors, tolerance=tolerance, details=details)
