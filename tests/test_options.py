"""GraceOptions: defaults, validation, mappings from torch.compile(options=...), cache directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from grace.options import CACHE_DIR_ENV, GraceOptions, GraceOptionsError


def test_defaults_enable_every_technique() -> None:
    opts = GraceOptions()
    assert (opts.cuda_graphs, opts.cgct, opts.pi, opts.scg) == (True, True, True, True)
    assert opts.clone_outputs is False
    assert opts.max_graphs_per_callable >= 1


def test_frozen() -> None:
    with pytest.raises(AttributeError):
        GraceOptions().pi = False  # type: ignore[misc]


@pytest.mark.parametrize(
    "changes",
    [
        {"scg_samples": 2},
        {"max_graphs_per_callable": 0},
        {"pi": "yes"},
        {"warmup_calls": -1},
        {"scg_samples": True},
    ],
)
def test_invalid_values_are_rejected_with_the_field_name(changes: dict[str, object]) -> None:
    with pytest.raises(GraceOptionsError, match=next(iter(changes))):
        GraceOptions(**changes)  # type: ignore[arg-type]


def test_from_mapping_and_unknown_keys() -> None:
    assert GraceOptions.from_value({"pi": False}).pi is False
    assert GraceOptions.from_value(None) == GraceOptions()
    with pytest.raises(GraceOptionsError, match=r"unknown grace option.*'pie'.*valid options"):
        GraceOptions.from_value({"pie": False})
    with pytest.raises(GraceOptionsError):
        GraceOptions.from_value(3)  # type: ignore[arg-type]


def test_cache_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert GraceOptions(cache_dir=str(tmp_path)).resolved_cache_dir() == tmp_path
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "env"))
    assert GraceOptions().resolved_cache_dir() == tmp_path / "env"
    monkeypatch.delenv(CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert GraceOptions().resolved_cache_dir() == tmp_path / "xdg" / "grace"


def test_to_dict_round_trips() -> None:
    opts = GraceOptions(pi=False, scg_samples=7)
    assert GraceOptions.from_value(opts.to_dict()) == opts
