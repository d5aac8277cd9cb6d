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


def profile_call(call: Callable[[], Any]) -> CallFacts:
    """Run ``call`` once under the profiler (CUDA must be available) and return its facts."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="grace-matrix-trace-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as handle:
            trace = json.load(handle)
    finally:
        os.unlink(path)
    return facts_from_trace(trace)
