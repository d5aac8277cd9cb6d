"""The TP suite's command-line options (``--tp-sizes``, ``--tp-timeout-s``), declared once.

suites/conftest.py declares them beside the suites' own options (suites/options.py) in every cell, so this
module imports neither torch nor anything that does (Triton-only cells collect the suites without torch).
The default TP sizes depend on the machine; ``default_tp_sizes`` derives them from the device type and
the number of visible CUDA devices, which the caller (suites/test_tp.py, where torch is imported) counts.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

AUTO = "auto"
CPU_TP_SIZES = (2,)  # gloo on the CPU: two ranks test the harness and the sharding before a GPU lease
DEFAULT_TIMEOUT_S = 1800.0  # one torchrun (every mode of one workload at one TP size)


def parse_tp_sizes(text: str) -> tuple[int, ...] | None:
    """``"auto"`` -> None (derive from the machine); ``"2,4"`` -> (2, 4), sorted, without repeats."""
    if text.strip() == AUTO:
        return None
    try:
        sizes = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma list of TP sizes; write e.g. '2,4' or 'auto'"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: TP sizes are whole numbers of at least 1, e.g. '2,4'")
    return tuple(sorted(sizes))


def default_tp_sizes(device_type: str, cuda_devices: int) -> tuple[int, ...]:
    """Every power of two from 2 up to ``cuda_devices`` on CUDA (none with one GPU); ``2`` on a CPU."""
    if device_type != "cuda":
        return CPU_TP_SIZES
    sizes, size = [], 2
    while size <= cuda_devices:
        sizes.append(size)
        size *= 2
    return tuple(sizes)


@dataclass(frozen=True)
class TPOptions:
    sizes: tuple[int, ...] | None = None  # None: default_tp_sizes for this machine
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_config(cls, config: Any) -> TPOptions:
        return cls(sizes=config.getoption("--tp-sizes"), timeout_s=config.getoption("--tp-timeout-s"))


def add_tp_options(parser: Any) -> None:
    """Declare the TP suite's options on a pytest parser (in the suites' option group)."""
    group = parser.getgroup("grace-matrix suites")
    group.addoption(
        "--tp-sizes",
        type=parse_tp_sizes,
        default=AUTO,
        help="comma list of tensor-parallel sizes for the tp suite, or 'auto' (default): every power of "
        "two from 2 up to the visible CUDA devices, or 2 (gloo on the CPU) without CUDA",
    )
    group.addoption(
        "--tp-timeout-s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"end one TP run (torchrun, every mode of one workload) after this many seconds "
        f"(default {DEFAULT_TIMEOUT_S:g})",
    )
