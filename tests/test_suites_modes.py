"""Mode selection and availability (suites/modes.py), with a stand-in grace module."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from suites import modes
from suites.modes import Mode

torch = pytest.importorskip("torch")


def fake_grace(techniques: dict[str, str | None] | None, api: bool = True) -> types.ModuleType:
    module = types.ModuleType("grace")
    module.calls = []  # type: ignore[attr-defined]
    if api:

        class GraceOptions:
            def __init__(self, **kwargs: Any) -> None:
                self.kwargs = kwargs

            @classmethod
            def from_value(cls, value: dict[str, Any]) -> GraceOptions:
                return cls(**value)

        def compile(model: Any, options: Any = None) -> Any:
            module.calls.append(options.kwargs)  # type: ignore[attr-defined]
            return model

        module.GraceOptions = GraceOptions  # type: ignore[attr-defined]
        module.compile = compile  # type: ignore[attr-defined]
        module.available_techniques = lambda: dict(techniques or {})  # type: ignore[attr-defined]
    return module


def test_parse_modes() -> None:
    assert modes.parse_modes("all") == modes.ALL_MODES
    assert modes.parse_modes(None) == modes.ALL_MODES
    assert modes.parse_modes("pt2cg, eager") == (Mode.EAGER, Mode.PT2CG)  # canonical order
    with pytest.raises(modes.ModeError, match="unknown mode"):
        modes.parse_modes("eager,turbo")


def test_option_names_match_modes() -> None:
    from suites.options import MODE_NAMES

    assert tuple(m.value for m in Mode) == MODE_NAMES


def test_cpu_skips_graph_modes_with_reason() -> None:
    assert modes.unavailable_reason(Mode.EAGER, "cpu") is None
    assert modes.unavailable_reason(Mode.INDUCTOR, "cpu") is None
    for mode in (Mode.PT2CG, Mode.PT2CG_NOPARTITION, Mode.GRACE, Mode.GRACE_CGCT, Mode.GRACE_CGCT_PI):
        reason = modes.unavailable_reason(mode, "cpu")
        assert reason is not None and "no CUDA device" in reason


def test_grace_cpu_runs_only_without_cuda() -> None:
    assert modes.unavailable_reason(Mode.GRACE_CPU, "cpu") is None
    reason = modes.unavailable_reason(Mode.GRACE_CPU, "cuda")
    assert reason is not None and "no-CUDA path" in reason


def test_grace_api_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "grace", fake_grace(None, api=False))
    reason = modes.unavailable_reason(Mode.GRACE, "cuda")
    assert reason is not None and "grace.compile" in reason


def test_grace_technique_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    available = {"runtime": None, "cgct": None, "pi": "cuda-bindings not available", "scg": None}
    monkeypatch.setitem(sys.modules, "grace", fake_grace(available))
    assert modes.unavailable_reason(Mode.GRACE_CGCT, "cuda") is None
    for mode in (Mode.GRACE, Mode.GRACE_CGCT_PI):
        reason = modes.unavailable_reason(mode, "cuda")
        assert reason is not None and "pi: cuda-bindings not available" in reason
    monkeypatch.setitem(sys.modules, "grace", fake_grace({"runtime": None}))
    assert "cgct: not provided" in (modes.unavailable_reason(Mode.GRACE_CGCT, "cuda") or "")


def test_grace_options_per_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    grace = fake_grace({"runtime": None, "cgct": None, "pi": None, "scg": None})
    monkeypatch.setitem(sys.modules, "grace", grace)
    model = torch.nn.Identity()
    for mode in modes.GRACE_MODES:
        assert modes.build(mode, model) is model
    assert grace.calls == [{}, {"cgct": True, "pi": False, "scg": False}, {"scg": False}, {}]  # type: ignore[attr-defined]


def test_prepare_dynamo_raises_the_recompile_limit() -> None:
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    # The config's own patch, which restores every limit after: pytest's monkeypatch finds no original
    # in a config module's __dict__ and deletes the option on undo, breaking Dynamo for later tests.
    limits = {n: 8 for n in ("recompile_limit", "cache_size_limit") if hasattr(dynamo_config, n)}
    with dynamo_config.patch(limits):
        modes.prepare_dynamo()
        assert getattr(dynamo_config, name) == modes.DYNAMO_CACHE_LIMIT


def test_eager_and_inductor_build() -> None:
    model = torch.nn.Identity()
    assert modes.build(Mode.EAGER, model) is model
    assert callable(modes.build(Mode.INDUCTOR, model))  # compiles lazily, on the first call


def test_grace_option_overrides_reach_every_grace_mode_and_its_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from suites.options import parse_grace_options

    grace = fake_grace({"runtime": None, "cgct": None, "pi": None, "scg": None})
    monkeypatch.setitem(sys.modules, "grace", grace)
    items = ["pi_direct=true", "scg_samples=5", "pi_table_update=node", "pi=False", "scg_margin=0.01"]
    overrides = parse_grace_options(items)
    assert overrides == {
        "pi_direct": True, "scg_samples": 5, "pi_table_update": "node", "pi": False, "scg_margin": 0.01
    }  # fmt: skip
    assert type(overrides["scg_samples"]) is int
    try:
        modes.set_grace_overrides(overrides)
        model = torch.nn.Identity()
        for mode in modes.GRACE_MODES:
            modes.build(mode, model)
        assert all(call["pi_direct"] is True and call["pi"] is False for call in grace.calls)  # type: ignore[attr-defined]
        assert grace.calls[1]["cgct"] is True  # type: ignore[attr-defined]  # the mode's own options stay
        assert modes.override_details(Mode.GRACE) == {"grace_option_overrides": overrides}
        assert modes.override_details(Mode.PT2CG) == {}
    finally:
        modes.set_grace_overrides({})
    assert modes.override_details(Mode.GRACE) == {}


@pytest.mark.parametrize("item", ["pi_direct", "=true", "pi_direct=", "  "])
def test_grace_option_needs_key_and_value(item: str) -> None:
    from suites.options import parse_grace_options

    with pytest.raises(ValueError, match="--grace-option takes KEY=VALUE"):
        parse_grace_options([item])


def test_grace_option_keys_and_values_are_checked_by_grace_options() -> None:
    pytest.importorskip("grace")
    from grace.options import GraceOptionsError

    with pytest.raises(GraceOptionsError, match="unknown grace option"):
        modes.set_grace_overrides({"pi_directly": True})
    with pytest.raises(GraceOptionsError, match="pi_table_update"):
        modes.set_grace_overrides({"pi_table_update": "fast"})
    assert modes.override_details(Mode.GRACE) == {}
