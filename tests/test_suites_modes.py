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
