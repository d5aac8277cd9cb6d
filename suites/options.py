"""The suites' command-line options, declared once.

``pytest suites/... --tier standard --modes eager,pt2cg --workloads 'Deberta*,mlp' --perf-samples 30``.
This module does not import torch: suites/conftest.py declares these options in every cell, including
Triton-only cells that run only the PI stage checks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

TIERS = ("smoke", "standard", "full")
MODE_NAMES = (
    "eager",
    "inductor",
    "pt2cg",
    "pt2cg-nopartition",
    "grace",
    "grace-cgct",
    "grace-cgct-pi",
    "grace-cpu",
    "raw-graph",
    "raw-graph-copy",
)
MIN_PERF_SAMPLES = 30
ENV_TIER = "GRACE_SUITE_TIER"  # set by the matrix runner from the cell's tier
PERF_GROUP = "gpu-performance"  # the xdist group of every performance test (never two on one GPU)


OptionValue = bool | int | float | str  # a --grace-option value, as GraceOptions takes it


@dataclass(frozen=True)
class SuiteOptions:
    tier: str = "smoke"
    modes: str = "all"
    workloads: str = "*"
    perf_samples: int = MIN_PERF_SAMPLES
    time_budget_s: float = 0.0  # 0: no budget
    device: str = "auto"
    grace_options: tuple[tuple[str, OptionValue], ...] = ()  # over every grace mode's own options

    @classmethod
    def from_config(cls, config: Any) -> SuiteOptions:
        return cls(
            tier=config.getoption("--tier"),
            modes=config.getoption("--modes"),
            workloads=config.getoption("--workloads"),
            perf_samples=config.getoption("--perf-samples"),
            time_budget_s=config.getoption("--time-budget-s"),
            device=config.getoption("--suite-device"),
            grace_options=tuple(parse_grace_options(config.getoption("--grace-option") or []).items()),
        )


def _option_value(text: str) -> OptionValue:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text.strip()


def parse_grace_options(items: list[str]) -> dict[str, OptionValue]:
    """``KEY=VALUE`` strings -> GraceOptions keyword arguments (true/false -> bool, an integer -> int,
    another number -> float).

    Raises ``ValueError`` naming the item for anything else; which keys and values grace accepts is
    GraceOptions' to say (suites.modes.set_grace_overrides checks them)."""
    parsed: dict[str, OptionValue] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"--grace-option takes KEY=VALUE, got {item!r}")
        parsed[key.strip()] = _option_value(value)
    return parsed


def add_options(parser: Any) -> None:
    """Declare the suites' options on a pytest parser."""
    group = parser.getgroup("grace-matrix suites")
    group.addoption(
        "--tier",
        choices=TIERS,
        default=os.environ.get(ENV_TIER) or "smoke",
        help="workload sizes: smoke (CPU, seconds), standard (one GPU lease), full (paper sizes); "
        f"default ${ENV_TIER}, else smoke",
    )
    group.addoption(
        "--modes", default="all", help=f"comma list of modes or 'all' (default): {', '.join(MODE_NAMES)}"
    )
    group.addoption("--workloads", default="*", help="comma list of workload name globs (default '*')")
    group.addoption(
        "--perf-samples",
        type=int,
        default=MIN_PERF_SAMPLES,
        help=f"timed calls per mode in the performance suite (default {MIN_PERF_SAMPLES})",
    )
    group.addoption(
        "--time-budget-s",
        type=float,
        default=0.0,
        help="do not start a new workload after this "
        "many seconds (its tests skip without a record, so a later run can resume); 0 = no budget",
    )
    group.addoption(
        "--grace-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a GraceOptions field for every grace mode, over the mode's own (repeatable), e.g. "
        "--grace-option pi_direct=true; recorded in each grace record's details",
    )
    group.addoption(
        "--suite-device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="device to run workloads on (default: cuda when available)",
    )
