"""GraCE as a ``torch.compile`` backend: CUDA-graph-aware code transformation (CGCT), parameter
indirection (PI) and selective CUDA graphs (SCG).

Use::

    import grace
    compiled = torch.compile(model, backend="grace")            # default options
    compiled = grace.compile(model, grace.GraceOptions(pi=False))  # explicit options
    print(grace.explain(model, *inputs))                         # what was captured and why not
    grace.stats.snapshot()                                       # per-graph facts

Outputs of a captured graph live in the graph's memory pool and may be overwritten by the next call with
the same input shapes and dtypes (strides and addresses may differ: the same graph may serve it); a call
with other shapes leaves them alone. Clone what you keep across calls, or set
``GraceOptions(clone_outputs=True)``.

The ``"grace"`` backend is registered with Dynamo by importing ``grace.backend``: ``import grace`` does
that when torch is already imported; otherwise Dynamo finds the backend through the installed
distribution's ``torch_dynamo_backends`` entry point on the first ``torch.compile(backend="grace")``.
So ``import grace`` never imports torch itself, and torch-free readers (the store, the dashboards)
may use grace's torch-free modules (``grace.pi_contract``, ``grace.options``). Everything else is
imported lazily; ``grace`` never imports ``suites``, ``matrix`` or ``dashboards``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from grace.options import GraceOptions, GraceOptionsError

__version__ = "0.1.0"

if TYPE_CHECKING:
    from grace.explanation import ExplainReport

__all__ = [
    "GraceOptions",
    "GraceOptionsError",
    "available_techniques",
    "compile",
    "explain",
    "reset",
    "stats",
]


def compile(model: Any, options: GraceOptions | None = None, **torch_compile_kwargs: Any) -> Any:
    """``torch.compile(model, backend=<grace with options>, **torch_compile_kwargs)``.

    ``torch_compile_kwargs`` are ``torch.compile``'s own (``fullgraph``, ``dynamic``, ...); ``backend``,
    ``mode`` and ``options`` are not accepted here: grace's options go in ``options``.
    """
    import torch

    from grace.backend import GraceBackend

    clash = sorted({"backend", "mode", "options"} & set(torch_compile_kwargs))
    if clash:
        raise GraceOptionsError(f"grace.compile() does not take {clash}; pass grace.GraceOptions as options")
    return torch.compile(model, backend=GraceBackend(options), **torch_compile_kwargs)


def available_techniques() -> dict[str, str | None]:
    """For "runtime", "cgct", "pi" and "scg": None when usable here, else the reason why not."""
    from grace.techniques import available

    return available()


def reset() -> None:
    """Release every CUDA graph and memory pool grace holds; ``torch._dynamo.reset()`` calls this too.

    A pool whose outputs the caller still holds is released once the last of them is dropped."""
    if importlib.util.find_spec("torch") is None:
        return
    from grace.backend import reset_runtime

    reset_runtime()


def explain(model: Any, *inputs: Any, options: GraceOptions | None = None) -> ExplainReport:
    """Compile ``model`` with grace, run it on ``inputs`` and report, per compiled graph, what was
    captured and why not (``.diagnoses`` holds CGCT's findings)."""
    from grace.explanation import explain as _explain

    return _explain(model, *inputs, options=options)


def __getattr__(name: str) -> Any:
    if name == "stats":
        return importlib.import_module("grace.stats")
    raise AttributeError(f"module 'grace' has no attribute {name!r}")


def _register() -> None:
    """Register the backend now when torch is imported (see the module docstring for the other case)."""
    if "torch" in sys.modules:
        importlib.import_module("grace.backend")  # registers "grace" and the Dynamo reset hook


_register()
