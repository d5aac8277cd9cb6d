"""Correctness verdict logic (suites/accuracy.py) with synthetic numbers and tiny tensors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from suites.accuracy import Figures, Tolerance, compare, judge, judge_moved, load_tolerances
from suites.records import CorrectnessStatus

torch = pytest.importorskip("torch")

TOL = Tolerance(rtol=1e-3, atol=1e-3)
PASS, FAIL = CorrectnessStatus.PASS, CorrectnessStatus.FAIL_ACCURACY


def leaves(*values: object) -> list[tuple[str, object]]:
    return [(f"out{i}", torch.as_tensor(v)) for i, v in enumerate(values)]


class TestJudge:
    def test_tol_ratio_boundary(self) -> None:
        assert judge(Figures(tol_ratio=1.0), TOL)[0] is PASS
        assert judge(Figures(tol_ratio=1.0 + 1e-12), TOL)[0] is FAIL

    def test_nan_never_passes(self) -> None:
        assert judge(Figures(tol_ratio=0.0, nan_count=1), TOL)[0] is FAIL
        assert judge(Figures(tol_ratio=math.nan), TOL)[0] is FAIL
        assert judge(Figures(tol_ratio=5.0, rmse_fp64=math.nan, ref_rmse_fp64=1.0), TOL)[0] is FAIL
        assert judge(Figures(tol_ratio=5.0, rmse_fp64=0.0, ref_rmse_fp64=math.nan), TOL)[0] is FAIL

    def test_fp64_rule_boundary(self) -> None:
        bound = 2.0 * 1e-4 + TOL.atol / 10.0
        assert judge(Figures(tol_ratio=3.0, rmse_fp64=bound, ref_rmse_fp64=1e-4), TOL)[0] is PASS
        status, why = judge(Figures(tol_ratio=3.0, rmse_fp64=bound * 1.001, ref_rmse_fp64=1e-4), TOL)
        assert status is FAIL and "float64" in why

    def test_without_fp64_outside_tolerance_fails(self) -> None:
        status, why = judge(Figures(tol_ratio=1.5, max_abs=0.1), TOL)
        assert status is FAIL and "no float64 reference" in why

    def test_mismatch_fails_first(self) -> None:
        assert judge(Figures(mismatch="shape"), TOL) == (FAIL, "shape")

    def test_moved_inputs(self) -> None:
        original = Figures(rel_l2=1e-4, tol_ratio=2.0)
        assert judge_moved(Figures(rel_l2=1e-4, tol_ratio=2.0), original, TOL)[0] is PASS
        stale = Figures(rel_l2=0.9, tol_ratio=500.0, max_abs=3.0)
        assert judge_moved(stale, original, TOL)[0] is FAIL
        assert judge_moved(Figures(nan_count=2), original, TOL)[0] is FAIL


class TestCompare:
    def test_identical(self) -> None:
        figures = compare(leaves([1.0, 2.0], [3]), leaves([1.0, 2.0], [3]), TOL)
        assert figures.max_abs == 0 and figures.tol_ratio == 0 and figures.cosine == pytest.approx(1.0)
        assert judge(figures, TOL)[0] is PASS

    def test_exact_tolerance_zero(self) -> None:
        exact = Tolerance(rtol=0.0, atol=0.0)
        assert judge(compare(leaves([1.0, 0.0]), leaves([1.0, 0.0]), exact), exact)[0] is PASS
        assert judge(compare(leaves([1.0, 1e-30]), leaves([1.0, 0.0]), exact), exact)[0] is FAIL

    def test_at_and_beyond_the_elementwise_bound(self) -> None:
        ref = torch.tensor([2.0], dtype=torch.float64)
        at = ref + (TOL.atol + TOL.rtol * 2.0) * 0.999
        beyond = ref + (TOL.atol + TOL.rtol * 2.0) * 1.01
        assert judge(compare([("x", at)], [("x", ref)], TOL), TOL)[0] is PASS
        assert judge(compare([("x", beyond)], [("x", ref)], TOL), TOL)[0] is FAIL

    def test_nan_in_result_fails_even_where_reference_is_nan(self) -> None:
        figures = compare(leaves([math.nan, 1.0]), leaves([math.nan, 1.0]), TOL)
        assert figures.nan_count == 1 and judge(figures, TOL)[0] is FAIL

    def test_nan_only_in_reference_fails(self) -> None:
        figures = compare(leaves([0.0, 1.0]), leaves([math.nan, 1.0]), TOL)
        assert math.isnan(figures.tol_ratio) and judge(figures, TOL)[0] is FAIL
        assert figures.to_dict()["tol_ratio"] is None  # JSON-safe

    def test_equal_infinities(self) -> None:
        assert judge(compare(leaves([math.inf, 1.0]), leaves([math.inf, 1.0]), TOL), TOL)[0] is PASS
        assert judge(compare(leaves([math.inf]), leaves([-math.inf]), TOL), TOL)[0] is FAIL

    def test_integer_outputs_must_match_exactly(self) -> None:
        figures = compare(leaves([1, 2, 3]), leaves([1, 2, 4]), TOL)
        assert figures.mismatch and "integer" in figures.mismatch

    def test_shape_and_structure(self) -> None:
        assert "shape" in (compare(leaves([1.0, 2.0]), leaves([1.0]), TOL).mismatch or "")
        assert "structure" in (compare(leaves([1.0]), leaves([1.0], [2.0]), TOL).mismatch or "")

    def test_fp64_rule_applies(self) -> None:
        truth = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
        eager = truth + 0.01  # eager is itself off by 0.01
        result = truth - 0.01  # off from eager by 0.02 (outside rtol/atol) but as accurate as eager
        figures = compare([("x", result)], [("x", eager)], TOL, [("x", truth)])
        assert figures.tol_ratio > 1
        assert figures.rmse_fp64 == pytest.approx(0.01) and figures.ref_rmse_fp64 == pytest.approx(0.01)
        assert judge(figures, TOL)[0] is PASS
        worse = compare([("x", truth + 0.5)], [("x", eager)], TOL, [("x", truth)])
        assert judge(worse, TOL)[0] is FAIL

    def test_figures(self) -> None:
        figures = compare(leaves([3.0, 4.0]), leaves([3.0, 0.0]), TOL)
        assert figures.max_abs == 4.0
        assert figures.rel_l2 == pytest.approx(4.0 / 3.0)
        assert figures.cosine == pytest.approx(3.0 / 5.0)
        assert set(figures.to_dict()) >= {"max_abs", "rel_l2", "cosine", "tol_ratio"}


class TestTolerances:
    def test_data_file(self) -> None:
        table = load_tolerances()
        assert table.for_("torch.float32") == Tolerance(rtol=1e-3, atol=1e-3)
        assert table.for_("float32", "pyhpc_turbulent_kinetic_energy").atol == 1e-8
        assert table.rerun() == Tolerance(rtol=0.0, atol=0.0)
        with pytest.raises(KeyError, match=r"\[dtype.int8\]"):
            table.for_("int8")

    def test_refuses_unknown_format(self, tmp_path: Path) -> None:
        path = tmp_path / "t.toml"
        path.write_text("format = 99\n")
        with pytest.raises(ValueError, match="format"):
            load_tolerances(path)
