"""Thresholds as data (matrix/thresholds.toml, matrix.regressions.thresholds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from matrix.regressions.errors import RegressionsConfigError
from matrix.regressions.thresholds import DEFAULT_PATH, Thresholds, load_thresholds, thresholds_from_mapping


def test_shipped_file_matches_the_documented_defaults() -> None:
    assert DEFAULT_PATH.name == "thresholds.toml" and DEFAULT_PATH.parent.name == "matrix"
    assert load_thresholds() == Thresholds()
    th = load_thresholds()
    assert th.pairwise.ratio == 0.05 and th.pairwise.alpha == 0.01
    assert th.status.fail_on == ("FAIL", "MISSING")


def test_partial_file_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(
        'format = 1\n[pairwise]\nratio = 0.1\n[[pairwise.override]]\nworkload = "llm*"\nratio = 0.2\n'
        "[history]\nmin_segment = 4\n"
    )
    th = load_thresholds(path)
    assert th.pairwise.ratio == 0.1
    assert th.pairwise.ratio_for("llm_decode", "grace") == 0.2
    assert th.pairwise.ratio_for("xlnet", "grace") == 0.1
    assert th.history.min_segment == 4 and th.history.min_step == 0.05


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"format": 9}, "newer than this reader"),
        ({"pairwise": {"ratoi": 0.1}}, "unknown key 'ratoi'"),
        ({"pairwise": {"ratio": "5%"}}, "pairwise.ratio: expected a value like 0.05"),
        ({"history": {"min_segment": 1}}, "min_segment must be >= 2"),
        ({"pairwise": {"alpha": 1.5}}, "alpha must be between 0 and 1"),
        ({"status": {"fail_on": ["FAIL", "FLAKY"]}}, "a flaky entry must never fail"),
        ({"status": {"fail_on": ["BROKEN"]}}, "unknown verdicts"),
        ({"plots": {}}, "unknown sections"),
        ({"pairwise": {"override": {"ratio": 1}}}, "array of tables"),
    ],
)
def test_bad_thresholds_name_the_key(data: dict, message: str) -> None:
    with pytest.raises(RegressionsConfigError, match=message):
        thresholds_from_mapping(data, "thresholds.toml")


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RegressionsConfigError, match="cannot read thresholds file"):
        load_thresholds(tmp_path / "none.toml")
