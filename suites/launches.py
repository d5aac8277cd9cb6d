"""Per-call launch facts from a profiler trace: kernels launched one by one, CUDA graph launches,
kernels executed inside graphs, bytes moved by memcpy, and the GPU-busy floor.

Problem: the performance suite must say not only how long a call took but why: how many kernels the
CPU launched, how many graph replays there were and how much work they held, and the physical limit
(the time the GPU was busy at all). These facts must come out the same way for every mode.

Design: profile one call with ``torch.profiler`` (CPU + CUDA activities), export the Chrome trace that
Kineto writes (a stable JSON format across the torch versions of the matrix) and reduce it with the pure
function ``facts_from_trace``, which the unit tests feed synthetic traces. A device kernel belongs to a
graph when Kineto tags it with a graph id or when its correlation id is that of a graph-launch API
call (CUPTI gives kernels replayed from a graph the correlation id of the launch); every other device
kernel was launched individually. The floor is the union of all device activity intervals (kernels,
memcpy, memset), so overlapping streams are not double counted.

``phases_from_trace`` splits the same facts by phase: a phase is a profiler range (``record_function``,
a ``user_annotation`` event) on the host, and a device kernel belongs to the phase whose range holds
the launch API call it correlates with (by time: a backward's kernels are launched from autograd's own
thread while the caller's range waits for it). suites.training marks forward, backward and optimizer.

``profile_steady`` answers the other question, what a call costs when calls follow each other: it
profiles many back-to-back calls and reports per call the busy time, the kernel and copy time and the
device's idle time between the first and the last activity (``steady_from_trace``). A floor taken from
one isolated call can sit below what the same kernels take in steady state (clocks, memory traffic of
the previous call); the steady busy time is the floor a back-to-back throughput figure is judged by.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

logger = logging.getLogger(__name__)

KERNEL_CATEGORIES = frozenset({"kernel"})
MEMCPY_CATEGORIES = frozenset({"gpu_memcpy"})
MEMSET_CATEGORIES = frozenset({"gpu_memset"})
API_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
ANNOTATION_CATEGORIES = frozenset({"user_annotation"})
GRAPH_LAUNCH_PREFIXES = ("cudaGraphLaunch", "cuGraphLaunch")


@dataclass(frozen=True)
class CallFacts:
    kernel_launches: int  # device kernels launched individually (outside any graph)
    graph_launches: int
    kernels_in_graphs: int
    busy_ms: float  # union of device activity: the floor no launch strategy can beat
    kernel_ms: float  # sum of kernel durations
    memcpy_count: int
    memcpy_bytes: int
    memset_count: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _graph_tagged(args: Mapping[str, Any]) -> bool:
    return any("graph" in key.lower() and value not in (None, 0, -1, "0", "") for key, value in args.items())


def _union_ms(intervals: Iterable[tuple[float, float]]) -> float:
    total = 0.0
    current_start = current_end = None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None and current_start is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None and current_start is not None:
        total += current_end - current_start
    return total / 1000.0  # trace timestamps are microseconds


def facts_from_trace(trace: Mapping[str, Any]) -> CallFacts:
    """Reduce a Kineto Chrome trace (``{"traceEvents": [...]}``) of exactly one call."""
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, Mapping) and e.get("ph") == "X"]
    graph_correlations = {
        e.get("args", {}).get("correlation")
        for e in events
        if e.get("cat") in API_CATEGORIES and str(e.get("name", "")).startswith(GRAPH_LAUNCH_PREFIXES)
    }
    graph_correlations.discard(None)
    graph_launches = len(graph_correlations)
    direct = in_graphs = memcpy_count = memcpy_bytes = memset_count = 0
    kernel_us = 0.0
    intervals: list[tuple[float, float]] = []
    for e in events:
        cat = e.get("cat")
        args = e.get("args", {}) or {}
        start, duration = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
        if cat in KERNEL_CATEGORIES:
            if _graph_tagged(args) or args.get("correlation") in graph_correlations:
                in_graphs += 1
            else:
                direct += 1
            kernel_us += duration
        elif cat in MEMCPY_CATEGORIES:
            memcpy_count += 1
            memcpy_bytes += int(args.get("bytes", 0) or 0)
        elif cat in MEMSET_CATEGORIES:
            memset_count += 1
        else:
            continue
        intervals.append((start, start + duration))
    return CallFacts(
        kernel_launches=direct,
        graph_launches=graph_launches,
        kernels_in_graphs=in_graphs,
        busy_ms=_union_ms(intervals),
        kernel_ms=kernel_us / 1000.0,
        memcpy_count=memcpy_count,
        memcpy_bytes=memcpy_bytes,
        memset_count=memset_count,
    )


@dataclass(frozen=True)
class PhaseFacts:
    """The launch facts of one phase of a call (kernels whose launch happened inside its range)."""

    kernel_launches: int
    graph_launches: int
    kernels_in_graphs: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def phases_from_trace(trace: Mapping[str, Any], phases: Iterable[str]) -> dict[str, PhaseFacts]:
    """Per phase name in ``phases``: the kernels launched (alone or in graphs) inside its host range."""
    names = tuple(phases)
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, Mapping) and e.get("ph") == "X"]
    ranges = [
        (str(e.get("name")), float(e.get("ts", 0.0)), float(e.get("ts", 0.0)) + float(e.get("dur", 0.0)))
        for e in events
        if e.get("cat") in ANNOTATION_CATEGORIES and e.get("name") in names
    ]

    def phase_at(ts: float) -> str | None:
        return next((name for name, start, end in ranges if start <= ts <= end), None)

    counts = {name: [0, 0, 0] for name in names}  # kernel launches, graph launches, kernels in graphs
    api_phase: dict[Any, str | None] = {}
    graph_correlations: set[Any] = set()
    for e in events:
        correlation = (e.get("args", {}) or {}).get("correlation")
        if e.get("cat") not in API_CATEGORIES or correlation is None:
            continue
        phase = api_phase[correlation] = phase_at(float(e.get("ts", 0.0)))
        if str(e.get("name", "")).startswith(GRAPH_LAUNCH_PREFIXES):
            graph_correlations.add(correlation)
            if phase is not None:
                counts[phase][1] += 1
    for e in events:
        args = e.get("args", {}) or {}
        phase = api_phase.get(args.get("correlation"))
        if e.get("cat") not in KERNEL_CATEGORIES or phase is None:
            continue
        in_graph = _graph_tagged(args) or args.get("correlation") in graph_correlations
        counts[phase][2 if in_graph else 0] += 1
    return {name: PhaseFacts(*values) for name, values in counts.items()}


@dataclass(frozen=True)
class SteadyFacts:
    """Per-call device figures of ``calls`` back-to-back calls (milliseconds per call)."""

    calls: int
    busy_ms: float  # union of device activity
    kernel_ms: float  # sum of kernel durations
    memcpy_ms: float  # sum of memcpy durations
    span_ms: float  # first device activity start to last end
    idle_ms: float  # span minus busy: the device waited for the host or for launches

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def steady_from_trace(trace: Mapping[str, Any], calls: int) -> SteadyFacts:
    """Reduce a Kineto Chrome trace of ``calls`` back-to-back calls to per-call figures."""
    if calls <= 0:
        raise ValueError(f"calls must be positive, not {calls}")
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, Mapping) and e.get("ph") == "X"]
    device = KERNEL_CATEGORIES | MEMCPY_CATEGORIES | MEMSET_CATEGORIES
    intervals: list[tuple[float, float]] = []
    kernel_us = memcpy_us = 0.0
    for e in events:
        cat = e.get("cat")
        if cat not in device:
            continue
        start, duration = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
        intervals.append((start, start + duration))
        if cat in KERNEL_CATEGORIES:
            kernel_us += duration
        elif cat in MEMCPY_CATEGORIES:
            memcpy_us += duration
    busy = _union_ms(intervals)
    span = (
        (max(end for _, end in intervals) - min(start for start, _ in intervals)) / 1000.0
        if intervals
        else 0.0
    )
    return SteadyFacts(
        calls=calls,
        busy_ms=busy / calls,
        kernel_ms=kernel_us / 1000.0 / calls,
        memcpy_ms=memcpy_us / 1000.0 / calls,
        span_ms=span / calls,
        idle_ms=max(0.0, span - busy) / calls,
    )


def _trace_of(run: Callable[[], Any], activities: Any) -> dict[str, Any]:
    """Run ``run`` under the profiler and return the Chrome trace Kineto exports."""
    from torch.profiler import profile

    with profile(activities=activities) as prof:
        run()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="grace-matrix-trace-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as handle:
            trace: dict[str, Any] = json.load(handle)
    finally:
        os.unlink(path)
    return trace


def profile_steady(call: Callable[[], Any], calls: int = 20) -> SteadyFacts:
    """Profile ``calls`` calls launched back to back (one synchronisation at the end)."""
    import torch
    from torch.profiler import ProfilerActivity

    def run() -> None:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()

    torch.cuda.synchronize()
    return steady_from_trace(_trace_of(run, [ProfilerActivity.CUDA]), calls)


def _profiled_once(call: Callable[[], Any]) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity

    def run() -> None:
        call()
        torch.cuda.synchronize()

    torch.cuda.synchronize()
    return _trace_of(run, [ProfilerActivity.CPU, ProfilerActivity.CUDA])


def profile_call(call: Callable[[], Any]) -> CallFacts:
    """Run ``call`` once under the profiler (CUDA must be available) and return its facts."""
    return facts_from_trace(_profiled_once(call))


def profile_call_phases(
    call: Callable[[], Any], phases: Iterable[str]
) -> tuple[CallFacts, dict[str, PhaseFacts]]:
    """``profile_call`` plus the facts of each of ``phases`` in the same trace."""
    trace = _profiled_once(call)
    return facts_from_trace(trace), phases_from_trace(trace, phases)
