"""The workload registry and every registered workload.

Importing this package registers all workloads (it imports torch; the registry module alone does not).
Order of registration is the order the suites run them in.
"""

from __future__ import annotations

from suites.workloads import hf, llm, pyhpc, recsys, speech, synthetic, vision  # noqa: F401  (register)
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
