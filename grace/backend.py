"""The Dynamo backend: CGCT, then Inductor with its own CUDA graphs off, then the grace graph runner.

Problem: ``torch.compile(model, backend="grace")`` hands us an FX graph and example inputs per Dynamo
graph and expects a callable back. Three techniques from other packages plug in (CGCT before Inductor,
PI inside capture, SCG in the runner), each of which may be missing or fail on a given torch, Triton or
CUDA; the backend must still return a correct callable and say what it declined and why.

Design (DESIGN 3.1): ``compile_graph`` runs ``grace.cgct.transform`` (its ``RestartAnalysis`` propagates
to Dynamo; any other failure is recorded and the original graph compiled), analyses inputs and mutations
(``grace.analysis``), compiles with ``compile_fx`` and ``triton.cudagraphs`` off (the inner compile's
``cudagraphs`` box forced False), and wraps the result in a ``GraceRunner``. Static inputs are taken from
Dynamo's marks on the inputs, not from the inner compile, so warm Inductor caches that skip the inner
compile change nothing. ``GraceBackend`` carries options (``grace.compile``); ``grace_backend`` is the
registered name ``"grace"`` and takes ``options=`` from ``torch.compile``. Both have ``reset()``, which
``torch._dynamo.reset()`` calls.

Invariant: the backend never raises for a technique that is unavailable; it raises only for user errors
(invalid options) and Dynamo's own control flow (``RestartAnalysis``).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grace.analysis import analyze_inputs, graph_effects
from grace.compat import cuda as cuda_compat
from grace.compat import torch as torch_compat
from grace.options import GraceOptions, GraceOptionsError
from grace.reasons import SkipCode, SkipReason, log_once
from grace.runner import Environment, GraceRunner, RunnerPlan

logger = logging.getLogger(__name__)


@dataclass
class CompiledGraphInfo:
    """What the backend did with one Dynamo graph (read by ``grace.explain``)."""

    callable_id: int
    graph_hash: str
    num_nodes: int
    num_inputs: int
    static_inputs: int
    dynamic_inputs: int
    skip: SkipReason | None
    cgct_transformed: bool
    cgct_note: SkipReason | None
    pi_note: SkipReason | None
    diagnoses: list[Any] = field(default_factory=list)
    mutated_inputs: tuple[int, ...] = ()


_collectors: list[list[CompiledGraphInfo]] = []
_collectors_lock = threading.Lock()


def collect_compiled_graphs() -> list[CompiledGraphInfo]:
    """Start collecting ``CompiledGraphInfo`` of graphs compiled from now on (see ``stop_collecting``)."""
    sink: list[CompiledGraphInfo] = []
    with _collectors_lock:
        _collectors.append(sink)
    return sink


def stop_collecting(sink: list[CompiledGraphInfo]) -> None:
    with _collectors_lock:
        if sink in _collectors:
            _collectors.remove(sink)


def _publish(info: CompiledGraphInfo) -> None:
    with _collectors_lock:
        for sink in _collectors:
            sink.append(info)


# --- seams -------------------------------------------------------------------------------------


def load_seam(package: str, *attributes: str) -> tuple[Any, SkipReason | None]:
    """Import ``grace.<package>`` and check it has ``attributes``; (module, None) or (None, reason)."""
    code = SkipCode.CGCT_UNAVAILABLE if package == "cgct" else SkipCode.PI_UNAVAILABLE
    try:
        module = importlib.import_module(f"grace.{package}")
    except Exception as exc:
        return None, SkipReason(code, f"grace.{package} not available: {type(exc).__name__}: {exc}")
    missing = [a for a in attributes if not callable(getattr(module, a, None))]
    if missing:
        return None, SkipReason(code, f"grace.{package} not available: it has no {', '.join(missing)}()")
    return module, None


def _environment(device: torch.device) -> Environment:
    driver = cuda_compat.driver_version()
    return Environment(
        gpu=torch_compat.device_name(device),
        driver=str(driver) if driver is not None else "unknown",
        cuda_runtime=str(torch_compat.cuda_runtime_version()),
        torch=torch_compat.TORCH_VERSION,
        triton=str(torch_compat.triton_version()),
    )


# --- the backend -------------------------------------------------------------------------------


def compile_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: GraceOptions
) -> Callable[..., Any]:
    """Compile one Dynamo graph for the grace runtime (see the module docstring)."""
    example_inputs = list(example_inputs)
    adapter: Callable[[list[Any]], list[Any]] | None = None
    diagnoses: list[Any] = []
    cgct_note: SkipReason | None = None
    cgct_transformed = False

    if options.cgct:
        cgct, cgct_note = load_seam("cgct", "transform")
        if cgct is not None:
            try:
                result = cgct.transform(gm, example_inputs)
            except torch._dynamo.exc.RestartAnalysis as exc:
                raise torch_compat.as_backend_restart(exc) from exc
            except Exception as exc:
                cgct_note = SkipReason(SkipCode.CGCT_FAILED, f"transform raised {type(exc).__name__}: {exc}")
                log_once(cgct_note, "CGCT")
            else:
                gm = result.gm
                example_inputs = list(result.example_inputs)
                adapter = result.input_adapter
                diagnoses = list(getattr(result, "diagnoses", []) or [])
                cgct_transformed = True
        else:
            diagnose_module, _ = load_seam("cgct", "diagnose")
            if diagnose_module is not None:
                try:
                    diagnoses = list(diagnose_module.diagnose(gm, example_inputs))
                except Exception:
                    logger.debug("grace: cgct.diagnose failed", exc_info=True)
    else:
        cgct_note = SkipReason(SkipCode.DISABLED_BY_OPTION, "cgct=False")

    graph_hash = torch_compat.graph_code_hash(gm)
    num_nodes = len(gm.graph.nodes)
    analysis = analyze_inputs(gm, example_inputs)
    effects = graph_effects(gm, example_inputs)
    mutated = effects.mutated
    skip = analysis.skip or effects.skip
    if not options.cuda_graphs:
        skip = SkipReason(SkipCode.DISABLED_BY_OPTION, "cuda_graphs=False")
    elif not torch_compat.cuda_available():
        skip = SkipReason(SkipCode.NO_CUDA, "no CUDA device: running Inductor without CUDA graphs")

    pi_prepare = None
    pi_note: SkipReason | None = None
    if skip is None and options.pi:
        pi_module, pi_note = load_seam("pi", "prepare")
        if pi_module is not None and cuda_compat.driver() is None:
            pi_note = SkipReason(SkipCode.CUDA_BINDINGS_MISSING, str(cuda_compat.import_error()))
            pi_module = None
        if pi_module is not None:
            pi_prepare = pi_module.prepare
    elif not options.pi:
        pi_note = SkipReason(SkipCode.DISABLED_BY_OPTION, "pi=False")

    record = torch_compat.InnerCompileRecord()
    compiled = torch_compat.compile_with_inductor(
        gm, example_inputs, record, need_inner_outputs=pi_prepare is not None
    )

    plan = RunnerPlan(
        graph_hash=graph_hash,
        device=analysis.device,
        static_indices=analysis.static_indices,
        dynamic_indices=analysis.dynamic_indices,
        scalar_indices=analysis.scalar_indices,
        mutated_indices=mutated,
        skip=skip,
        output_codes=tuple(record.output_codes),
        input_adapter=adapter,
        pi_prepare=pi_prepare,
        pi_unavailable=pi_note,
        random_ops=effects.random_ops,
    )
    environment = _environment(analysis.device) if skip is None and analysis.device is not None else None
    runner = GraceRunner(compiled, plan, options, environment)
    _publish(
        CompiledGraphInfo(
            callable_id=runner.callable_id,
            graph_hash=graph_hash,
            num_nodes=num_nodes,
            num_inputs=len(example_inputs),
            static_inputs=len(analysis.static_indices),
            dynamic_inputs=len(analysis.dynamic_indices),
            skip=skip,
            cgct_transformed=cgct_transformed,
            cgct_note=cgct_note,
            pi_note=pi_note,
            diagnoses=diagnoses,
            mutated_inputs=mutated,
        )
    )
    return runner


class GraceBackend:
    """A grace backend with fixed options: ``torch.compile(model, backend=GraceBackend(options))``."""

    def __init__(self, options: GraceOptions | None = None) -> None:
        self.options = GraceOptions.from_value(options)

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any
    ) -> Callable[..., Any]:
        if kwargs:
            raise GraceOptionsError(
                f"GraceBackend got {sorted(kwargs)}; pass grace options to GraceBackend(options) instead"
            )
        return compile_graph(gm, example_inputs, self.options)

    def reset(self) -> None:
        reset_runtime()

    def __eq__(self, other: object) -> bool:
        # Same class, not isinstance: a subclass with its own equality (explain's) stays unequal both ways.
        return type(other) is type(self) and other.options == self.options  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self.options)


def grace_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: GraceOptions | dict[str, Any] | None = None,
    mode: str | None = None,
) -> Callable[..., Any]:
    """The ``"grace"`` Dynamo backend; ``torch.compile(m, backend="grace", options={...})``."""
    if mode not in (None, "default"):
        raise GraceOptionsError(
            f"the grace backend has no mode {mode!r}; choose techniques with options, e.g. "
            "torch.compile(m, backend='grace', options={'pi': False})"
        )
    return compile_graph(gm, example_inputs, GraceOptions.from_value(options))


def reset_runtime() -> None:
    """Release every graph and its memory pool; counters and logged reasons start over."""
    from grace import reasons, scg, stats
    from grace.runner import release_all

    release_all()
    stats.reset()
    reasons.reset_logged()
    scg.forget_caches()
    if torch_compat.cuda_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


grace_backend.reset = reset_runtime  # type: ignore[attr-defined]
