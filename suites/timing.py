"""Interleaved latency sampling with CUDA events.

Problem: clocks, thermals and other tenants drift during a run; timing one mode after another turns
that drift into fake speedups. Design: every round times each mode once, in a fresh order drawn from a
seeded generator, so each mode sees every position and every predecessor about equally often (a mode
that always ran right after the same other mode would inherit whatever state that one leaves behind:
allocator pools, caches, host-side bookkeeping). One sample is one call: the stream is synchronised
first (the GPU is idle), an event is recorded before the call and one after, and the elapsed time
between them includes the CPU's launch overhead, which is what CUDA graphs remove; the host time until
the call returned is kept beside it on request. Raw samples are returned; summaries are the report's
job. Back to back (``time_back_to_back``): each sample is ``calls_per_sample`` calls launched one after
the other between one event pair, in the same interleaved rounds, so it shows the throughput a
host-bound caller gets (the host's cost per call, once the GPU keeps up), where a synchronised call
shows the latency of one call.

Invariant: a mode whose call raises stops being timed; its error is returned, the others go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from grace.scg import interleaved_order  # one plan of rounds for SCG's timing and the suites'

logger = logging.getLogger(__name__)


def _rounds(
    calls: dict[str, Callable[[], Any]],
    rounds: int,
    sample: Callable[[str, Callable[[], Any]], float],
    what: str,
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """``rounds`` interleaved rounds of ``sample(name, call)`` (each from an idle GPU), and errors by name:
    a call that raises stops being sampled, the others go on."""
    import torch

    results: dict[str, list[float]] = {name: [] for name in calls}
    errors: dict[str, str] = {}
    for order in interleaved_order(list(calls), rounds):
        for name in order:
            if name in errors:
                continue
            torch.cuda.synchronize()
            try:
                value = sample(name, calls[name])
            except Exception as exc:  # recorded, and the remaining modes keep their rounds
                errors[name] = f"{type(exc).__name__}: {exc}"
                logger.warning("%s of %s failed: %s", what, name, errors[name])
                continue
            results[name].append(value)
    return results, errors


def time_interleaved(
    calls: dict[str, Callable[[], Any]], samples: int, host_ms: dict[str, list[float]] | None = None
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """``samples`` CUDA-event timings (ms) of every call, interleaved; plus errors by name. With
    ``host_ms`` given, it receives per name the host milliseconds each timed call took to return."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def one_call(name: str, call: Callable[[], Any]) -> float:
        start.record()
        began = time.perf_counter()
        call()
        returned = time.perf_counter()
        end.record()
        end.synchronize()
        if host_ms is not None:
            host_ms.setdefault(name, []).append((returned - began) * 1e3)
        return float(start.elapsed_time(end))

    return _rounds(calls, samples, one_call, "timing")


def time_back_to_back(
    calls: dict[str, Callable[[], Any]], rounds: int, calls_per_sample: int
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Per name, ``rounds`` samples of the mean milliseconds per call of ``calls_per_sample`` calls
    launched back to back (interleaved like ``time_interleaved``); plus errors by name."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def calls_in_a_row(name: str, call: Callable[[], Any]) -> float:
        start.record()
        for _ in range(calls_per_sample):
            call()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / calls_per_sample

    return _rounds(calls, rounds, calls_in_a_row, "back-to-back timing")


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
