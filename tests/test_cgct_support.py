"""Helpers for the CGCT tests (no tests here): the fake-CUDA harness lives in suites/cgct_harness.py,
shared with the CGCT stage suite; this module re-exports it under the name the tests import."""

from __future__ import annotations

from suites.cgct_harness import (
    CPU,
    CUDA,
    DEVICE_MAP,
    Capture,
    Twins,
    capture,
    devices_of,
    real_inputs,
    strict_fake_run,
)

__all__ = [
    "CPU",
    "CUDA",
    "DEVICE_MAP",
    "Capture",
    "Twins",
    "capture",
    "devices_of",
    "real_inputs",
    "strict_fake_run",
]
