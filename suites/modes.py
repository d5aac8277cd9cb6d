"""The modes every workload runs in, how each is built, and why one cannot run here.

Modes:
- ``eager``: the model as is (the reference every other mode is compared with).
- ``inductor``: ``torch.compile`` with default options (no CUDA graphs).
- ``pt2cg``: ``torch.compile(mode="reduce-overhead")``, PyTorch's CUDA graphs (cudagraph trees).
- ``pt2cg-nopartition``: the same with ``graph_partition=False``, which reproduces PyTorch < 2.9: a CPU
  op disables capture instead of splitting the graph (only where that config exists).
- ``grace``: ``grace.compile`` with every technique; ``grace-cgct`` (CGCT, graphs with input copies,
  no PI, no SCG) and ``grace-cgct-pi`` (no SCG) are the ablations.
- ``grace-cpu``: ``grace.compile`` on a machine without CUDA: grace must take its no-graph path (reason
  ``no_cuda``) and give eager's values. It is how a CPU-only cell shows that grace imports, registers as
  a backend and compiles on its torch; on a CUDA device it is skipped (``grace`` covers that).
- ``raw-graph`` and ``raw-graph-copy``: timing references, not products (suites.raw_graph): Inductor's
  kernels captured by hand and replayed bare, or after copying the call's inputs into the graph's own.
  The performance suite times them beside the other modes; the correctness suite does not run them.

Invariant: a mode that cannot run says why in one line (``unavailable_reason``), which the suites record
as a ``skip``; nothing falls back silently. A grace mode lights up as soon as ``grace`` provides its API
and reports the techniques it needs as available.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class Mode(str, enum.Enum):
    EAGER = "eager"
    INDUCTOR = "inductor"
    PT2CG = "pt2cg"
    PT2CG_NOPARTITION = "pt2cg-nopartition"
    GRACE = "grace"
    GRACE_CGCT = "grace-cgct"
    GRACE_CGCT_PI = "grace-cgct-pi"
    GRACE_CPU = "grace-cpu"
    RAW_GRAPH = "raw-graph"
    RAW_GRAPH_COPY = "raw-graph-copy"


@dataclass(frozen=True)
class ModeSpec:
    mode: Mode
    uses_graphs: bool  # replays CUDA graphs (input-address checks apply)
    needs_cuda: bool
    cpu_only: bool = False  # checks a no-CUDA path: skipped where a CUDA device is used
    techniques: tuple[str, ...] = ()  # grace techniques the mode needs (grace.available_techniques keys)
    grace_options: tuple[tuple[str, bool], ...] = ()  # GraceOptions keyword arguments
    timing_reference: bool = False  # timed by the performance suite only (not a way to run a model)


SPECS: dict[Mode, ModeSpec] = {
    Mode.EAGER: ModeSpec(Mode.EAGER, uses_graphs=False, needs_cuda=False),
    Mode.INDUCTOR: ModeSpec(Mode.INDUCTOR, uses_graphs=False, needs_cuda=False),
    Mode.PT2CG: ModeSpec(Mode.PT2CG, uses_graphs=True, needs_cuda=True),
    Mode.PT2CG_NOPARTITION: ModeSpec(Mode.PT2CG_NOPARTITION, uses_graphs=True, needs_cuda=True),
    Mode.GRACE: ModeSpec(
        Mode.GRACE, uses_graphs=True, needs_cuda=True, techniques=("runtime", "cgct", "pi", "scg")
    ),
    Mode.GRACE_CGCT: ModeSpec(
        Mode.GRACE_CGCT,
        uses_graphs=True,
        needs_cuda=True,
        techniques=("runtime", "cgct"),
        grace_options=(("cgct", True), ("pi", False), ("scg", False)),
    ),
    Mode.GRACE_CGCT_PI: ModeSpec(
        Mode.GRACE_CGCT_PI,
        uses_graphs=True,
        needs_cuda=True,
        techniques=("runtime", "cgct", "pi"),
        grace_options=(("scg", False),),
    ),
    Mode.GRACE_CPU: ModeSpec(Mode.GRACE_CPU, uses_graphs=False, needs_cuda=False, cpu_only=True),
    Mode.RAW_GRAPH: ModeSpec(Mode.RAW_GRAPH, uses_graphs=True, needs_cuda=True, timing_reference=True),
    Mode.RAW_GRAPH_COPY: ModeSpec(
        Mode.RAW_GRAPH_COPY, uses_graphs=True, needs_cuda=True, timing_reference=True
    ),
}

ALL_MODES: tuple[Mode, ...] = tuple(Mode)
GRACE_MODES: tuple[Mode, ...] = (Mode.GRACE, Mode.GRACE_CGCT, Mode.GRACE_CGCT_PI, Mode.GRACE_CPU)
GRACE_API = ("compile", "GraceOptions", "available_techniques")
DYNAMO_CACHE_LIMIT = 64  # every mode compiles the same code objects once; the default limit is 8


class ModeError(ValueError):
    """An unknown mode name in a selection."""


def parse_modes(text: str | None) -> tuple[Mode, ...]:
    """``"all"``/empty -> every mode; else a comma list of mode names, in the canonical order."""
    if not text or text.strip() == "all":
        return ALL_MODES
    wanted = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(wanted - {m.value for m in Mode})
    if unknown:
        raise ModeError(f"unknown mode(s) {unknown}; choose from {', '.join(m.value for m in Mode)} or 'all'")
    return tuple(m for m in Mode if m.value in wanted)


def _grace() -> Any:
    return importlib.import_module("grace")


def grace_reason(spec: ModeSpec) -> str | None:
    """Why ``grace`` cannot run ``spec`` here, or None."""
    try:
        grace = _grace()
    except Exception as exc:
        return f"grace cannot be imported: {type(exc).__name__}: {exc}"
    missing = [name for name in GRACE_API if not hasattr(grace, name)]
    if missing:
        return f"grace API not available yet: grace.{', grace.'.join(missing)} missing"
    try:
        techniques = dict(grace.available_techniques())
    except Exception as exc:
        return f"grace.available_techniques() failed: {type(exc).__name__}: {exc}"
    reasons = []
    for technique in spec.techniques:
        if technique not in techniques:
            reasons.append(f"{technique}: not provided by this grace")
        elif techniques[technique] is not None:
            reasons.append(f"{technique}: {techniques[technique]}")
    return f"grace technique unavailable ({'; '.join(reasons)})" if reasons else None


def unavailable_reason(mode: Mode, device_type: str) -> str | None:
    """None when ``mode`` can run on a ``device_type`` device here, else the reason it cannot."""
    spec = SPECS[mode]
    if spec.needs_cuda and device_type != "cuda":
        return f"no CUDA device: {mode.value} replays CUDA graphs"
    if spec.cpu_only and device_type == "cuda":
        return f"a CUDA device is used: {mode.value} checks grace's no-CUDA path (grace covers this device)"
    if mode is Mode.PT2CG_NOPARTITION:
        from grace.compat import dynamo as dynamo_compat

        if not dynamo_compat.graph_partition_supported():
            return "torch has no inductor graph_partition config: pt2cg-nopartition is pt2cg on this version"
    if mode in GRACE_MODES:
        return grace_reason(spec)
    return None


def prepare_dynamo() -> None:
    """Let every mode compile the same code objects without hitting Dynamo's recompile limit (which
    would silently fall back to eager). The option was renamed ``recompile_limit`` in newer torch."""
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name) and getattr(dynamo_config, name) < DYNAMO_CACHE_LIMIT:
            setattr(dynamo_config, name, DYNAMO_CACHE_LIMIT)


_grace_overrides: dict[str, Any] = {}


def set_grace_overrides(overrides: dict[str, Any]) -> None:
    """GraceOptions fields every grace mode takes over its own (``--grace-option``); checked here so that
    a wrong key or value stops the run before any workload, with GraceOptions' message."""
    if overrides:
        grace = _grace()
        grace.GraceOptions.from_value({**dict(SPECS[Mode.GRACE].grace_options), **overrides})
    _grace_overrides.clear()
    _grace_overrides.update(overrides)


def override_details(mode: Mode) -> dict[str, Any]:
    """What a record of ``mode`` says about ``--grace-option`` (nothing when none was given)."""
    if mode in GRACE_MODES and _grace_overrides:
        return {"grace_option_overrides": dict(_grace_overrides)}
    return {}


def build(mode: Mode, model: Any) -> Callable[..., Any]:
    """The callable that runs ``model`` in ``mode``. Compilation itself happens on the first call."""
    import torch

    prepare_dynamo()
    if mode is Mode.EAGER:
        return model
    if mode is Mode.INDUCTOR:
        return torch.compile(model)
    if mode is Mode.PT2CG:
        return torch.compile(model, mode="reduce-overhead")
    if mode is Mode.PT2CG_NOPARTITION:
        return torch.compile(model, options={"triton.cudagraphs": True, "graph_partition": False})
    if SPECS[mode].timing_reference:
        from suites.raw_graph import RawGraph

        return RawGraph(torch.compile(model), copy_inputs=mode is Mode.RAW_GRAPH_COPY)
    grace = _grace()
    options = grace.GraceOptions.from_value({**dict(SPECS[mode].grace_options), **_grace_overrides})
    return grace.compile(model, options=options)


def reset_compilers() -> None:
    """Drop every compiled artefact (Dynamo caches, cudagraph trees, grace state) between workloads."""
    import torch

    torch._dynamo.reset()
    try:
        grace = _grace()
    except Exception:
        return
    if hasattr(grace, "reset"):
        grace.reset()
