"""The performance suite's logic: one workload, every mode -> one ``PerformanceRecord`` per mode.

Steps: compile and warm up every mode first (shared with the correctness suite through
suites.harness), then profile one call per mode (launch facts, GPU-busy floor), then time all modes in
interleaved rounds with CUDA events (suites.timing), keeping the median host time a call took to
return (``details.host_ms_median``: the launch cost the CPU paid before the GPU could finish), then
time them back to back in interleaved rounds too (``details.b2b_samples_ms``, per call, with
``b2b_calls_per_sample``: enough calls for a sample to span ``B2B_SAMPLE_MS`` at the fastest mode's
latency). The timing references (``raw-graph``, ``raw-graph-copy``) are timed as their bare replay
(suites.raw_graph). Bytes
copied per replay: for PyTorch2-CG modes the device bytes of the non-static (user) inputs when the
call replayed a graph (cudagraph trees copy each into its static placeholder), for grace modes the
``copy_bytes_per_replay`` grace.stats reports for the mode's own graphs; modes that replay no graph
have none. Speedups are not computed here: the report derives them from records of the same run.
A training workload's callable is a ``suites.training.TrainStep``: one sample is one iteration
(forward, backward, optimizer step; the model's state moves on with every call, which timing does not
mind), its profile counts the kernels of the whole iteration and ``details.phases`` splits them into
forward, backward and optimizer.

Invariant: on a machine without CUDA every mode is recorded as ``skip`` with reason "no CUDA device":
CPU timings of GPU-oriented modes would mean nothing.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from suites import grace_stats
from suites.harness import CompiledMode, Failure, PreparedWorkload, describe
from suites.launches import CallFacts, profile_call, profile_call_phases
from suites.modes import GRACE_MODES, Mode, override_details
from suites.raw_graph import RawGraph
from suites.records import CorrectnessStatus, PerformanceRecord, PerformanceStatus
from suites.tensors import device_input_bytes
from suites.timing import time_back_to_back, time_interleaved
from suites.training import PHASES, TrainStep

logger = logging.getLogger(__name__)

PERF_WARMUP_CALLS = 5
B2B_SAMPLE_MS = 2.0  # a back-to-back sample spans about this long at the fastest mode's latency
B2B_CALLS = (4, 64)  # bounds of the calls per back-to-back sample
NO_CUDA = "no CUDA device"
PT2CG_MODES = (Mode.PT2CG, Mode.PT2CG_NOPARTITION)


def _status_of(failure: Failure) -> PerformanceStatus:
    if failure.status is CorrectnessStatus.OOM:
        return PerformanceStatus.OOM
    if failure.expected or failure.status is CorrectnessStatus.SKIP:
        return PerformanceStatus.SKIP
    return PerformanceStatus.FAIL_TO_RUN


def _bound(entry: CompiledMode) -> Callable[[], Any]:
    fn, inputs = entry.fn, entry.inputs
    assert fn is not None
    if isinstance(fn, RawGraph):  # a timing reference: its physical cost, not its Python wrapper's
        return fn.timed_call(inputs)
    return lambda: fn(*inputs)


def _calls_per_sample(latency_ms: dict[str, list[float]]) -> int:
    medians = [statistics.median(v) for v in latency_ms.values() if v]
    fastest = min(medians) if medians else B2B_SAMPLE_MS
    low, high = B2B_CALLS
    return max(low, min(high, math.ceil(B2B_SAMPLE_MS / max(fastest, 1e-3))))


def measure(prepared: PreparedWorkload, modes: Sequence[Mode], samples: int) -> list[PerformanceRecord]:
    ref = prepared.workload.ref(prepared.tier)
    if prepared.device.type != "cuda":
        return [PerformanceRecord(ref, m.value, PerformanceStatus.SKIP, reason=NO_CUDA) for m in modes]
    if prepared.load_failure is not None:
        failure = prepared.load_failure
        reason = f"{failure.status.value}: {failure.reason}"
        return [PerformanceRecord(ref, m.value, _status_of(failure), reason=reason) for m in modes]
    with torch.no_grad():
        return _measure(prepared, modes, samples)


def _measure(prepared: PreparedWorkload, modes: Sequence[Mode], samples: int) -> list[PerformanceRecord]:
    ref = prepared.workload.ref(prepared.tier)
    done: dict[Mode, PerformanceRecord] = {}
    ready: dict[Mode, CompiledMode] = {}
    for mode in modes:
        entry = prepared.compiled_mode(mode)
        if entry.failure is not None or entry.fn is None:
            failure = entry.failure or Failure(CorrectnessStatus.FAIL_TO_RUN, "not compiled")
            done[mode] = PerformanceRecord(ref, mode.value, _status_of(failure), reason=failure.reason)
            continue
        try:
            for _ in range(PERF_WARMUP_CALLS):
                entry.fn(*entry.inputs)
            torch.cuda.synchronize()
        except Exception as exc:
            status = (
                PerformanceStatus.OOM
                if "out of memory" in str(exc).lower()
                else PerformanceStatus.FAIL_TO_RUN
            )
            done[mode] = PerformanceRecord(ref, mode.value, status, reason=f"warm-up: {describe(exc)}")
            continue
        ready[mode] = entry
    facts: dict[Mode, CallFacts | str] = {}
    phases: dict[Mode, dict[str, Any]] = {}
    for mode, entry in ready.items():
        try:
            if isinstance(entry.fn, TrainStep):
                facts[mode], split = profile_call_phases(_bound(entry), PHASES)
                phases[mode] = {name.removeprefix("train."): f.to_dict() for name, f in split.items()}
            else:
                facts[mode] = profile_call(_bound(entry))
        except Exception as exc:  # the timing is still worth having
            facts[mode] = f"profiler: {describe(exc, 500)}"
            logger.warning("profiling %s/%s failed: %s", prepared.workload.name, mode.value, facts[mode])
    host: dict[str, list[float]] = {}
    calls = {m.value: _bound(e) for m, e in ready.items()}
    timings, errors = time_interleaved(calls, samples, host)
    per_sample = _calls_per_sample(timings)
    b2b, b2b_errors = time_back_to_back(
        {name: fn for name, fn in calls.items() if name not in errors}, max(5, samples // 3), per_sample
    )
    snapshot = grace_stats.snapshot() if any(m in GRACE_MODES for m in ready) else {}
    for mode, entry in ready.items():
        done[mode] = record = _record(
            prepared, mode, entry, facts[mode], timings[mode.value], errors.get(mode.value), snapshot, samples
        )
        if isinstance(entry.fn, TrainStep):
            record.details.update(entry.fn.details(), training_iteration=True)
            if mode in phases:
                record.details["phases"] = phases[mode]
        if host.get(mode.value):
            record.details["host_ms_median"] = statistics.median(host[mode.value])
        if b2b.get(mode.value):
            record.details.update(b2b_samples_ms=b2b[mode.value], b2b_calls_per_sample=per_sample)
            record.details["b2b_ms_median"] = statistics.median(b2b[mode.value])
        elif mode.value in b2b_errors:
            record.details["b2b_error"] = b2b_errors[mode.value]
    return [done[m] for m in modes]


def _record(
    prepared: PreparedWorkload,
    mode: Mode,
    entry: CompiledMode,
    facts: CallFacts | str,
    samples: list[float],
    error: str | None,
    snapshot: dict[str, Any],
    requested: int,
) -> PerformanceRecord:
    details: dict[str, Any] = {
        "samples_requested": requested,
        "warmup_calls": PERF_WARMUP_CALLS,
        "device_name": torch.cuda.get_device_name(prepared.device),
        "dtype": str(prepared.dtype).removeprefix("torch."),
        "calls_peak_mem_bytes": entry.calls_peak_mem_bytes,
        "resident_mem_bytes": entry.resident_mem_bytes,
        "calls_peak_reserved_bytes": entry.calls_peak_reserved_bytes,
        **({"compile_facts": entry.compile_facts} if entry.compile_facts else {}),
        **override_details(mode),
    }
    copy_bytes: int | None = None
    if isinstance(facts, CallFacts):
        details.update({k: v for k, v in facts.to_dict().items() if k not in ("busy_ms",)})
        if mode in PT2CG_MODES:
            copy_bytes = device_input_bytes(entry.inputs) if facts.graph_launches else 0
            details["copy_bytes_source"] = "user inputs copied into static placeholders (cudagraph trees)"
    else:
        details["profile_error"] = facts
    if mode in GRACE_MODES:
        mine = grace_stats.select(snapshot, entry.grace_keys)
        details["grace_stats"] = mine
        copy_bytes = grace_stats.total(mine, "copy_bytes_per_replay")
        details["copy_bytes_source"] = (
            "grace.stats copy_bytes_per_replay" if copy_bytes is not None else "none"
        )
    status = PerformanceStatus.OK
    reason = None
    if error is not None:
        status = PerformanceStatus.OOM if "out of memory" in error.lower() else PerformanceStatus.FAIL_TO_RUN
        reason = f"timing: {error}"
    elif not samples:
        status, reason = PerformanceStatus.FAIL_TO_RUN, "no samples"
    return PerformanceRecord(
        workload=prepared.workload.ref(prepared.tier),
        mode=mode.value,
        status=status,
        reason=reason,
        samples_ms=tuple(samples),
        median_ms=statistics.median(samples) if samples else None,
        floor_ms=facts.busy_ms if isinstance(facts, CallFacts) else None,
        compile_s=entry.compile_s,
        peak_mem_bytes=entry.peak_mem_bytes,
        kernels_in_graphs=facts.kernels_in_graphs if isinstance(facts, CallFacts) else None,
        kernel_launches=facts.kernel_launches if isinstance(facts, CallFacts) else None,
        graph_launches=facts.graph_launches if isinstance(facts, CallFacts) else None,
        copy_bytes_per_replay=copy_bytes,
        details=details,
    )
