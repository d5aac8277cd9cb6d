"""What counts as grace giving eager's result: one tensor against another, within the stated tolerance.

Problem: the fuzzer compares thousands of tensors (outputs, mutated inputs, held outputs, module state,
generator state) and each difference must say where it was found and by how much, so a failing
schedule can be read without rerunning it.

Design: ``compare(expected, actual, tolerance, where)`` returns None or a ``Mismatch``: a tensor of
another type, device, dtype or shape is a mismatch of its own kind; values differ when
``|actual - expected| > atol + rtol * |expected|`` anywhere (NaN matches NaN, an infinity matches the
same infinity). The tolerance comes from suites/fuzz/fuzz.toml per dtype (``Settings.tolerance_for``).

Invariant: comparison never changes either tensor (it works on detached copies in float64).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any

import torch

from suites.fuzz.settings import Tolerance


class MismatchKind(str, enum.Enum):
    VALUES = "values"  # the numbers differ beyond the tolerance
    METADATA = "metadata"  # type, device, dtype or shape differ
    STRUCTURE = "structure"  # a different number of outputs
    EXCEPTION = "exception"  # grace raised where eager did not
    RNG_STATE = "rng_state"  # the generator is left in another state than eager leaves it


@dataclass(frozen=True)
class Mismatch:
    """One difference from eager: at which call (its position in the schedule), what was compared
    (``where``: "output 1", "input x0", "held output 0 of call 3", "attribute cpu0"...), and how."""

    call: int
    where: str
    kind: str  # a MismatchKind value
    detail: str
    max_abs: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _describe(t: torch.Tensor) -> str:
    return f"{type(t).__name__} {tuple(t.shape)} {t.dtype} on {t.device}"


def compare(expected: Any, actual: Any, tolerance: Tolerance, where: str, call: int) -> Mismatch | None:
    """None when ``actual`` is eager's ``expected`` (module docstring), else the mismatch."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor) or expected != actual:
            return Mismatch(
                call, where, MismatchKind.METADATA.value, f"eager gave {expected!r}, grace {actual!r}"
            )
        return None
    if (
        type(expected) is not type(actual)
        or expected.device != actual.device
        or expected.dtype != actual.dtype
        or expected.shape != actual.shape
    ):
        detail = f"eager gave {_describe(expected)}, grace {_describe(actual)}"
        return Mismatch(call, where, MismatchKind.METADATA.value, detail)
    if expected.numel() == 0:
        return None
    want = expected.detach().to("cpu", torch.float64)
    got = actual.detach().to("cpu", torch.float64)
    close = torch.isclose(got, want, rtol=tolerance.rtol, atol=tolerance.atol, equal_nan=True)
    if bool(close.all()):
        return None
    finite = torch.isfinite(want) & torch.isfinite(got)
    error = (got - want).abs()[finite]
    max_abs = float(error.max()) if error.numel() else float("inf")
    bad = int((~close).sum())
    detail = f"{bad} of {close.numel()} elements differ (atol {tolerance.atol:g}, rtol {tolerance.rtol:g})"
    return Mismatch(call, where, MismatchKind.VALUES.value, detail, max_abs)


def compare_all(
    expected: tuple[Any, ...], actual: tuple[Any, ...], tolerance: Tolerance, where: str, call: int
) -> list[Mismatch]:
    """Element by element; a different count is one ``structure`` mismatch."""
    if len(expected) != len(actual):
        detail = f"eager gave {len(expected)} values, grace {len(actual)}"
        return [Mismatch(call, where, MismatchKind.STRUCTURE.value, detail)]
    found = (
        compare(e, a, tolerance, f"{where} {i}", call)
        for i, (e, a) in enumerate(zip(expected, actual, strict=True))
    )
    return [m for m in found if m is not None]
