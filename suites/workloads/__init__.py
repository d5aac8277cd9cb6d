"""The workload registry and every registered workload.

Importing this package registers all workloads (it imports torch; the registry module alone does not).
Order of registration is the order the suites run them in.
"""

from __future__ import annotations

import importlib

from suites.workloads.registry import (
    Tag,
    Tier,
    Workload,
    WorkloadError,
    WorkloadUnavailable,
    all_workloads,
    code_hash,
    get,
    names,
    register,
    select,
    unregister,
    workload,
)

# Registration order is run order: cheap workloads first, so a time-boxed run completes as many as it can.
# Training workloads come last: they reuse the inference workloads registered before them.
MODULES = ("synthetic", "pyhpc", "recsys", "llm", "speech", "hf", "vision", "training")
for _module in MODULES:
    importlib.import_module(f"suites.workloads.{_module}")

__all__ = [
    "Tag",
    "Tier",
    "Workload",
    "WorkloadError",
    "WorkloadUnavailable",
    "all_workloads",
    "code_hash",
    "get",
    "names",
    "register",
    "select",
    "unregister",
    "workload",
]
