"""Interleaved latency sampling with CUDA events.

Problem: clocks, thermals and other tenants drift during a run; timing one mode after another turns
that drift into fake speedups. Design: every round times each mode once, in an order rotated by one
position per round, so each mode sees every position equally often. One sample is one call: the
stream is synchronised first (the GPU is idle), an event is recorded before the call and one after,
and the elapsed time between them includes the CPU's launch overhead, which is what CUDA graphs
remove. Raw samples are returned; summaries are the report's job.

Invariant: a mode whose call raises stops being timed; its error is returned, the others go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)


def interleaved_order(names: Sequence[str], rounds: int) -> list[list[str]]:
    """``rounds`` orders of ``names``, each rotated one step further than the previous one."""
    n = len(names)
    return [[names[(r + i) % n] for i in range(n)] for r in range(rounds)] if n else []


def time_interleaved(
    calls: dict[str, Callable[[], Any]], samples: int
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """``samples`` CUDA-event timings (ms) of every call, interleaved; plus errors by name."""
    import torch

    results: dict[str, list[float]] = {name: [] for name in calls}
    errors: dict[str, str] = {}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for order in interleaved_order(list(calls), samples):
        for name in order:
            if name in errors:
                continue
            torch.cuda.synchronize()
            try:
                start.record()
                calls[name]()
                end.record()
                end.synchronize()
            except Exception as exc:  # recorded, and the remaining modes keep their rounds
                errors[name] = f"{type(exc).__name__}: {exc}"
                logger.warning("timing %s failed: %s", name, errors[name])
                continue
            results[name].append(float(start.elapsed_time(end)))
    return results, errors


def mean_back_to_back_ms(fn: Callable[[], Any], iters: int) -> float:
    """Mean milliseconds per call of ``iters`` calls launched back to back between one pair of CUDA
    events (the GPU check scripts' throughput figure, not the per-call latency of ``time_interleaved``)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / iters


def host_ms_per_call(fn: Callable[[], Any], calls: int = 6, repeats: int = 5, hold_ms: float = 50.0) -> float:
    """Median host milliseconds one call takes to return while the GPU is held busy (a sleep kernel
    queued first), so the figure is the CPU's launch cost alone, never time spent waiting for the GPU.
    ``calls`` stays small: a call that must wait for its own earlier work (a ring of pinned buffers, a
    synchronising read) would otherwise wait for the sleep."""
    import time

    import torch

    cycles = int(hold_ms * 2e6)  # at least hold_ms on any clock up to 2 GHz
    per_call: list[float] = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - start) * 1e3 / calls)
        torch.cuda.synchronize()
    per_call.sort()
    return per_call[len(per_call) // 2]
