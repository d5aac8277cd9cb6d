"""Building blocks every workload builder uses: seeding, placing the model, drawing inputs.

Invariant: a builder called twice with the same size, device and dtype returns models with identical
weights and identical inputs (weights from a seeded global RNG, inputs from a seeded CPU generator and
then moved), so reruns and the float64 reference see the same numbers on every device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)

WEIGHT_SEED = 20260
INPUT_SEED = 4242


def seed_weights() -> None:
    """Call before constructing modules: their random initialisation then depends on nothing else."""
    torch.manual_seed(WEIGHT_SEED)


def place(model: M, device: torch.device | str, dtype: torch.dtype) -> M:
    """The model in inference mode on ``device``, floating parameters and buffers in ``dtype``."""
    return model.to(device=device, dtype=dtype).eval()


def generator() -> torch.Generator:
    return torch.Generator().manual_seed(INPUT_SEED)


def randn(
    shape: Sequence[int],
    device: torch.device | str,
    dtype: torch.dtype,
    gen: torch.Generator,
    *,
    scale: float = 1.0,
    shift: float = 0.0,
) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, dtype=torch.float32) * scale + shift).to(device, dtype)


def uniform(
    shape: Sequence[int],
    low: float,
    high: float,
    device: torch.device | str,
    dtype: torch.dtype,
    gen: torch.Generator,
) -> torch.Tensor:
    return (torch.rand(*shape, generator=gen, dtype=torch.float32) * (high - low) + low).to(device, dtype)


def randint(
    shape: Sequence[int], high: int, device: torch.device | str, gen: torch.Generator
) -> torch.Tensor:
    return torch.randint(0, high, tuple(shape), generator=gen, dtype=torch.int64).to(device)


def import_optional(package: str) -> Any:
    """Import ``package`` or raise WorkloadUnavailable (never a bare crash): ``installed`` False where
    the environment has no such package, True where it has one that fails to import."""
    import importlib
    import importlib.util

    from suites.workloads.registry import WorkloadUnavailable

    if importlib.util.find_spec(package.partition(".")[0]) is None:
        raise WorkloadUnavailable(package, "which is not installed here", installed=False)
    try:
        return importlib.import_module(package)
    except Exception as exc:  # broken installs raise RuntimeError/OSError, not only ImportError
        raise WorkloadUnavailable(package, exc) from exc
