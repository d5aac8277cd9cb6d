"""Performance suite: every selected workload gets one PerformanceRecord per mode.

Performance tests must never share a GPU: they all belong to the xdist group ``gpu-performance``, so
with ``-n N --dist loadgroup`` they run one after another in a single worker, and a file lock
(suites/gpu_lock.py) serialises them whatever the distribution mode. For clean timings run the
performance suite without other GPU work (the GPU scripts use one process). Without CUDA every mode is
recorded as ``skip`` ("no CUDA device").
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("torch", reason="the performance suite needs torch (Triton-only cells run the PI checks)")

from suites.gpu_lock import exclusive_gpu
from suites.harness import prepare, resolve_device
from suites.modes import parse_modes
from suites.options import PERF_GROUP, SuiteOptions
from suites.performance import NO_CUDA, measure
from suites.records import PerformanceStatus, Record
from suites.workloads import get

pytestmark = [pytest.mark.performance, pytest.mark.xdist_group(PERF_GROUP)]


def test_performance(
    workload_name: str, suite_options: SuiteOptions, grace_record: Callable[[Record], None]
) -> None:
    prepared = prepare(get(workload_name), suite_options.tier, resolve_device(suite_options.device))
    with exclusive_gpu(enabled=prepared.device.type == "cuda"):
        records = measure(prepared, parse_modes(suite_options.modes), suite_options.perf_samples)
    for record in records:
        grace_record(record)
    if prepared.device.type != "cuda":
        pytest.skip(NO_CUDA)
    broken = [r for r in records if r.status in (PerformanceStatus.FAIL_TO_RUN, PerformanceStatus.OOM)]
    if broken:
        pytest.fail("; ".join(f"{r.mode}: {r.status.value}: {r.reason}" for r in broken), pytrace=False)
    if all(r.status is PerformanceStatus.SKIP for r in records):
        pytest.skip("; ".join(sorted({r.reason or "" for r in records})))
