"""Correctness figures and verdicts: how far a result is from eager and from float64, and whether that
passes.

Problem: a compiled mode never matches eager bit for bit; a fixed tolerance either hides real errors
in small outputs or flags harmless reordering in large reductions. PyTorch's dynamo runner therefore
also accepts a result that is no less accurate than eager itself, measured against a float64 run.

Design: ``compare`` reduces two flattened outputs (``suites.tensors.Leaves``) to a frozen ``Figures``
(max_abs, rel_l2, cosine, tol_ratio, the float64 RMS errors, NaN count, structure mismatch); ``judge``
turns figures into a status with pure float logic, so the verdict rules are tested with synthetic
numbers. Tolerances are data (suites/tolerances.toml).

Invariants: a NaN in a result never passes (``judge`` fails it before looking at any tolerance, and
NaN figures fail every comparison); equal infinities count as equal; integer and boolean outputs must
match exactly; a structure or shape mismatch fails with the paths that differ.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from suites.records import CorrectnessStatus

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 cells
    import tomli as tomllib

if TYPE_CHECKING:
    from suites.tensors import Leaves

TOLERANCES_PATH = Path(__file__).with_name("tolerances.toml")
TOLERANCES_FORMAT = 1


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    fp64_multiplier: float = 2.0
    fp64_floor_divisor: float = 10.0

    def to_dict(self) -> dict[str, float]:
        return {
            "rtol": self.rtol,
            "atol": self.atol,
            "fp64_multiplier": self.fp64_multiplier,
            "fp64_floor_divisor": self.fp64_floor_divisor,
        }


@dataclass(frozen=True)
class ToleranceTable:
    dtypes: dict[str, dict[str, float]]
    workloads: dict[str, dict[str, float]] = field(default_factory=dict)
    comparison: dict[str, float] = field(default_factory=dict)
    eager_rerun: dict[str, float] = field(default_factory=dict)
    training: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    def for_(self, dtype: str, workload: str | None = None) -> Tolerance:
        """Tolerance for outputs of ``dtype`` ("float32", "torch.float32" ...) of ``workload``."""
        name = dtype.removeprefix("torch.")
        if name not in self.dtypes:
            raise KeyError(
                f"no tolerance for dtype {name!r} in {TOLERANCES_PATH.name}; add a [dtype.{name}] table"
            )
        values = {**self.dtypes[name], **self.workloads.get(workload or "", {})}
        return Tolerance(
            rtol=float(values["rtol"]),
            atol=float(values["atol"]),
            fp64_multiplier=float(self.comparison.get("fp64_multiplier", 2.0)),
            fp64_floor_divisor=float(self.comparison.get("fp64_floor_divisor", 10.0)),
        )

    def for_training(self, quantity: str, dtype: str) -> Tolerance:
        """Tolerance for a training ``quantity`` (``loss``, ``grad``, ``param``) computed in ``dtype``."""
        name = dtype.removeprefix("torch.")
        values = self.training.get(name, {}).get(quantity)
        if values is None:
            raise KeyError(
                f"no training tolerance for {quantity!r} in {name!r} in {TOLERANCES_PATH.name}; "
                f"add a [training.{name}.{quantity}] table"
            )
        return Tolerance(
            rtol=float(values["rtol"]),
            atol=float(values["atol"]),
            fp64_multiplier=float(self.comparison.get("fp64_multiplier", 2.0)),
            fp64_floor_divisor=float(self.comparison.get("fp64_floor_divisor", 10.0)),
        )

    def rerun(self) -> Tolerance:
        return Tolerance(
            rtol=float(self.eager_rerun.get("rtol", 0.0)), atol=float(self.eager_rerun.get("atol", 0.0))
        )


def load_tolerances(path: Path | None = None) -> ToleranceTable:
    data = tomllib.loads((path or TOLERANCES_PATH).read_text())
    fmt = data.get("format")
    if fmt != TOLERANCES_FORMAT:
        raise ValueError(f"tolerances file format {fmt!r} is not {TOLERANCES_FORMAT}; update grace-matrix")
    return ToleranceTable(
        dtypes=dict(data.get("dtype", {})),
        workloads=dict(data.get("workload", {})),
        comparison=dict(data.get("comparison", {})),
        eager_rerun=dict(data.get("eager_rerun", {})),
        training=dict(data.get("training", {})),
    )


@dataclass(frozen=True)
class Figures:
    """What separates a result from its reference. ``tol_ratio`` is the largest elementwise
    ``|res - ref| / (atol + rtol |ref|)``: at most 1 means allclose."""

    max_abs: float = 0.0
    rel_l2: float = 0.0
    cosine: float = 1.0
    tol_ratio: float = 0.0
    elements: int = 0
    nan_count: int = 0
    mismatch: str | None = None
    rmse_fp64: float | None = None
    ref_rmse_fp64: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        """JSON-safe figures: a non-finite value becomes None (``nan_count`` and the verdict say why),
        because strict JSON stores (PostgreSQL) reject NaN and infinity."""
        out: dict[str, float | None] = {
            "max_abs": self.max_abs,
            "rel_l2": self.rel_l2,
            "cosine": self.cosine,
            "tol_ratio": self.tol_ratio,
            "elements": float(self.elements),
            "nan_count": float(self.nan_count),
        }
        if self.rmse_fp64 is not None:
            out["rmse_fp64"] = self.rmse_fp64
        if self.ref_rmse_fp64 is not None:
            out["ref_rmse_fp64"] = self.ref_rmse_fp64
        return {k: (v if v is None or math.isfinite(v) else None) for k, v in out.items()}


def judge(figures: Figures, tolerance: Tolerance) -> tuple[CorrectnessStatus, str]:
    """The verdict for ``figures`` under ``tolerance`` and the sentence that explains it."""
    if figures.mismatch:
        return CorrectnessStatus.FAIL_ACCURACY, figures.mismatch
    if figures.nan_count > 0:
        return CorrectnessStatus.FAIL_ACCURACY, f"NaN in {figures.nan_count} output element(s)"
    if figures.tol_ratio <= 1.0:  # False for NaN
        return (
            CorrectnessStatus.PASS,
            f"within rtol={tolerance.rtol:g} atol={tolerance.atol:g} of the reference",
        )
    res, ref = figures.rmse_fp64, figures.ref_rmse_fp64
    if res is not None and ref is not None:
        bound = tolerance.fp64_multiplier * ref + tolerance.atol / tolerance.fp64_floor_divisor
        if res <= bound:
            return CorrectnessStatus.PASS, (
                f"outside rtol/atol of eager (max_abs={figures.max_abs:.3g}) but as accurate as eager "
                f"against float64 (rmse {res:.3g} <= {bound:.3g})"
            )
        return CorrectnessStatus.FAIL_ACCURACY, (
            f"max_abs={figures.max_abs:.3g} tol_ratio={figures.tol_ratio:.3g} and float64 rmse {res:.3g} > "
            f"{bound:.3g} ({tolerance.fp64_multiplier:g} x eager's {ref:.3g} "
            f"+ atol/{tolerance.fp64_floor_divisor:g})"
        )
    return CorrectnessStatus.FAIL_ACCURACY, (
        f"max_abs={figures.max_abs:.3g} rel_l2={figures.rel_l2:.3g} tol_ratio={figures.tol_ratio:.3g} "
        "(no float64 reference to fall back on)"
    )


def _structure(result: Leaves, reference: Leaves) -> str | None:
    res_paths, ref_paths = [p for p, _ in result], [p for p, _ in reference]
    if res_paths != ref_paths:
        missing = sorted(set(ref_paths) - set(res_paths))
        extra = sorted(set(res_paths) - set(ref_paths))
        if not missing and not extra:
            return "outputs come in a different order than the reference's"
        return f"output structure differs: missing {missing[:5]}, extra {extra[:5]}"
    for (path, a), (_, b) in zip(result, reference, strict=True):
        if tuple(a.shape) != tuple(b.shape):
            return f"output {path!r} has shape {tuple(a.shape)}, reference {tuple(b.shape)}"
        if a.is_floating_point() != b.is_floating_point() or a.is_complex() != b.is_complex():
            return f"output {path!r} has dtype {a.dtype}, reference {b.dtype}"
    return None


def _worst(a: float, b: float) -> float:
    """max that propagates NaN (Python's max silently drops a NaN in second position)."""
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


def compare(result: Leaves, reference: Leaves, tolerance: Tolerance, fp64: Leaves | None = None) -> Figures:
    """Figures of ``result`` against ``reference`` (and both against ``fp64`` when given)."""
    import torch

    mismatch = _structure(result, reference)
    if mismatch:
        return Figures(mismatch=mismatch)
    fp64_by_path = dict(fp64) if fp64 is not None else None
    if fp64_by_path is not None and set(fp64_by_path) != {p for p, _ in reference}:
        fp64_by_path = None  # a float64 run with another structure cannot serve as a reference
    max_abs = tol_ratio = 0.0
    diff_sq = ref_sq = res_sq = dot = 0.0
    err_res = err_ref = 0.0
    elements = nan_count = 0
    for path, res, ref in ((p, a, b) for (p, a), (_, b) in zip(result, reference, strict=True)):
        if not res.is_floating_point():
            bad = int((res.to(ref.device) != ref).sum().item())
            if bad:
                return Figures(
                    mismatch=f"{bad} element(s) of integer output {path!r} differ from the reference"
                )
            continue
        a = res.detach().to(ref.device, torch.float64)
        b = ref.detach().to(torch.float64)
        elements += a.numel()
        nan_count += int(torch.isnan(a).sum().item())
        if a.numel() == 0:
            continue
        same = a == b  # equal infinities count as equal
        d = torch.where(same, torch.zeros_like(a), (a - b).abs())
        max_abs = _worst(max_abs, float(d.max().item()))
        ratio = torch.where(d == 0, torch.zeros_like(d), d / (tolerance.atol + tolerance.rtol * b.abs()))
        tol_ratio = _worst(tol_ratio, float(ratio.max().item()))  # 0/0 counts as 0: exact-match tolerances
        diff_sq += float((d * d).sum().item())
        ref_sq += float((b * b).sum().item())
        res_sq += float((a * a).sum().item())
        dot += float((a * b).sum().item())
        if fp64_by_path is not None:
            c = fp64_by_path[path].detach().to(a.device, torch.float64)
            err_res += float(((a - c) ** 2).sum().item())
            err_ref += float(((b - c) ** 2).sum().item())
    rel_l2 = math.sqrt(diff_sq) / math.sqrt(ref_sq) if ref_sq > 0 else (0.0 if diff_sq == 0 else math.inf)
    if res_sq == 0 and ref_sq == 0:
        cosine = 1.0
    elif res_sq == 0 or ref_sq == 0:
        cosine = 0.0
    else:
        cosine = dot / math.sqrt(res_sq * ref_sq)
    rmse = ref_rmse = None
    if fp64_by_path is not None and elements:
        rmse, ref_rmse = math.sqrt(err_res / elements), math.sqrt(err_ref / elements)
    return Figures(
        max_abs=max_abs,
        rel_l2=rel_l2,
        cosine=cosine,
        tol_ratio=tol_ratio,
        elements=elements,
        nan_count=nan_count,
        rmse_fp64=rmse,
        ref_rmse_fp64=ref_rmse,
    )


def judge_moved(moved: Figures, original: Figures, tolerance: Tolerance) -> tuple[CorrectnessStatus, str]:
    """Verdict for a rerun on inputs at new addresses with new values (no float64 reference there).

    Passes within rtol/atol of eager on the new inputs, or when its relative L2 error is no worse than
    twice the error the same mode had on the original inputs plus rtol: a graph that kept reading
    stale addresses is off by O(1), far above that bound.
    """
    status, why = judge(moved, tolerance)
    if status is CorrectnessStatus.PASS or moved.mismatch or moved.nan_count:
        return status, why
    bound = 2.0 * original.rel_l2 + tolerance.rtol
    if moved.rel_l2 <= bound:
        return (
            CorrectnessStatus.PASS,
            f"rel_l2 {moved.rel_l2:.3g} <= {bound:.3g} (as close as on the original inputs)",
        )
    return CorrectnessStatus.FAIL_ACCURACY, f"rel_l2 {moved.rel_l2:.3g} > {bound:.3g}: {why}"
