"""The Dynamo backend: CGCT, then Inductor with its own CUDA graphs off, then the grace graph runner.

Problem: ``torch.compile(model, backend="grace")`` hands us an FX graph and example inputs per Dynamo
graph and expects a callable back. Three techniques from other packages plug in (CGCT before Inductor,
PI inside capture, SCG in the runner), each of which may be missing or fail on a given torch, Triton or
CUDA; the backend must still return a correct callable and say what it declined and why.

Design (DESIGN 3.1): CGCT and PI are loaded by name through ``grace.seams`` (an import failure costs
only that technique). ``compile_graph`` runs ``grace.cgct.transform`` (any failure is recorded and the
original graph compiled), analyses inputs and mutations (``grace.analysis``), compiles with
``compile_fx`` and ``triton.cudagraphs`` off (the inner compile's ``cudagraphs`` box forced False), and
wraps the result in a ``GraceRunner`` behind a ``GuardedRunner``. Static inputs are taken from Dynamo's
marks on the inputs, not from the inner compile, so warm Inductor caches that skip the inner compile
change nothing. ``GraceBackend`` carries options (``grace.compile``); ``grace_backend`` is the
registered name ``"grace"`` (registered when this module is imported) and takes ``options=`` from
``torch.compile``. Both have ``reset()``, which ``torch._dynamo.reset()`` calls.

Invariant: the backend never raises for its own failures, at compile time or during a call (Note:
[The backend never raises for its own failures]); it raises for user errors (invalid options, a model
that raises in eager too) and for Inductor's failures on Dynamo's own graph.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grace import philox
from grace.adapting import InputAdapting
from grace.analysis import InputAnalysis, analyze_inputs, graph_effects
from grace.compat import cuda as cuda_compat
from grace.compat import torch as torch_compat
from grace.compat.aot import GraphRole, InnerGraph
from grace.guard import CountedCallable, GuardedRunner, SafePath
from grace.options import GraceOptions, GraceOptionsError
from grace.reasons import SkipCode, SkipReason, log_once
from grace.runner import Environment, GraceRunner, RunnerPlan
from grace.seams import load_seam
from grace.training import InnerFacts, TrainingGraphs

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
    role: str = "inference"  # grace.compat.aot.GraphRole: a training graph's forward or backward


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

# Note: [The backend never raises for its own failures]
# Whatever grace's own code raises while compiling a graph (CGCT, the analysis of inputs and mutations,
# preparing PI, building the runner) costs only that part: CGCT's failure compiles the graph Dynamo
# gave, an analysis failure runs Inductor without CUDA graphs, and Inductor failing on the graph CGCT
# produced compiles Dynamo's graph instead. Each is a ``SkipReason`` (logged once, counted). What
# Inductor raises on Dynamo's own graph is not grace's failure and propagates, as with
# ``backend="inductor"``. At run time ``GuardedRunner`` wraps the runner: when a call raises, it is run
# again on the safe path (Inductor's callable without a graph; Dynamo's graph run eagerly where the
# CGCT adapter itself failed). When the safe path succeeds, the failure was grace's: recorded as
# ``runner_failed`` and every later call takes the safe path. When it raises too, the error is the
# user's (their model raises in eager as well) and propagates unchanged. A call that already ran a
# callable that mutates its inputs is never run again (its side effects would apply twice): then the
# exception propagates.


@dataclass
class _Stage:
    """The graph to compile and what CGCT did to it."""

    gm: torch.fx.GraphModule
    example_inputs: list[Any]
    adapter: InputAdapting | None = None
    diagnoses: list[Any] = field(default_factory=list)
    note: SkipReason | None = None
    transformed: bool = False


def _apply_cgct(gm: torch.fx.GraphModule, example_inputs: list[Any], options: GraceOptions) -> _Stage:
    """CGCT's result, or the graph as given with the reason CGCT was left out (never raises)."""
    stage = _Stage(gm, example_inputs)
    if not options.cgct:
        stage.note = SkipReason(SkipCode.DISABLED_BY_OPTION, "cgct=False")
        return stage
    cgct, stage.note = load_seam("cgct", "transform")
    if cgct is None:
        diagnose_module, _ = load_seam("cgct", "diagnose")
        if diagnose_module is not None:
            try:
                stage.diagnoses = list(diagnose_module.diagnose(gm, example_inputs))
            except Exception:
                logger.debug("grace: cgct.diagnose failed", exc_info=True)
        return stage
    try:
        result = cgct.transform(gm, example_inputs)
        transformed = _Stage(
            result.gm,
            list(result.example_inputs),
            result.input_adapter,
            list(getattr(result, "diagnoses", []) or []),
            transformed=True,
        )
    except Exception as exc:
        stage.note = SkipReason(SkipCode.CGCT_FAILED, f"transform raised {type(exc).__name__}: {exc}")
        log_once(stage.note, "CGCT")
        return stage
    return transformed


@dataclass(frozen=True)
class _Facts:
    analysis: InputAnalysis
    mutated: tuple[int, ...]
    random_ops: tuple[str, ...]


def _analyse(gm: torch.fx.GraphModule, example_inputs: list[Any], options: GraceOptions) -> _Facts:
    """Inputs, mutations and random ops of ``gm``; a failure of the analysis means no CUDA graph."""
    try:
        analysis = analyze_inputs(gm, example_inputs)
        effects = graph_effects(gm, example_inputs)
        facts = _Facts(analysis, effects.mutated, effects.random_ops)
    except Exception as exc:
        reason = SkipReason(SkipCode.BACKEND_FAILED, f"analysis raised {type(exc).__name__}: {exc}")
        log_once(reason, "analysis")
        return _Facts(InputAnalysis((), (), (), None, reason), (), ())
    skip = analysis.skip or effects.skip
    if not options.cuda_graphs:
        skip = SkipReason(SkipCode.DISABLED_BY_OPTION, "cuda_graphs=False")
    elif not torch_compat.cuda_available():
        skip = SkipReason(SkipCode.NO_CUDA, "no CUDA device: running Inductor without CUDA graphs")
    if skip is not analysis.skip:
        facts = _Facts(dataclasses.replace(analysis, skip=skip), facts.mutated, facts.random_ops)
    return facts


def _pi_seam(skip: SkipReason | None, options: GraceOptions) -> tuple[Any, SkipReason | None]:
    """(PI's ``prepare``, None) or (None, why PI is left out)."""
    if not options.pi:
        return None, SkipReason(SkipCode.DISABLED_BY_OPTION, "pi=False")
    if skip is not None:
        return None, None
    try:
        pi_module, pi_note = load_seam("pi", "prepare")
        if pi_module is not None and cuda_compat.driver() is None:
            return None, SkipReason(SkipCode.CUDA_BINDINGS_MISSING, str(cuda_compat.import_error()))
    except Exception as exc:
        return None, SkipReason(SkipCode.PI_UNAVAILABLE, f"loading PI raised {type(exc).__name__}: {exc}")
    return (pi_module.prepare if pi_module is not None else None), pi_note


def compile_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: GraceOptions
) -> Callable[..., Any]:
    """Compile one Dynamo graph for the grace runtime (see the module docstring)."""
    given = _Stage(gm, list(example_inputs))
    stage = _apply_cgct(gm, given.example_inputs, options)
    try:
        return _compile_stage(stage, options, eager=gm)
    except Exception as exc:
        if not stage.transformed:
            raise  # Inductor's own failure on Dynamo's graph (Note: [The backend never raises ...])
        reason = SkipReason(
            SkipCode.CGCT_FAILED,
            f"compiling the graph CGCT produced raised {type(exc).__name__}: {exc}; compiled the "
            "graph without CGCT",
        )
        log_once(reason, "CGCT", logging.WARNING)
        logger.debug("grace: compile of the CGCT graph failed", exc_info=True)
        given.note, given.diagnoses = reason, stage.diagnoses
        return _compile_stage(given, options, eager=gm)


def _compile_stage(stage: _Stage, options: GraceOptions, eager: Callable[..., Any]) -> Callable[..., Any]:
    gm, example_inputs = stage.gm, stage.example_inputs
    facts = _analyse(gm, example_inputs, options)
    pi_prepare, pi_note = _pi_seam(facts.analysis.skip, options)
    training = _training_hook(facts, options)
    if training is not None:
        reason = SkipReason(
            SkipCode.AUTOGRAD,
            "needs autograd: the forward and backward graphs AOTAutograd compiles get runners of their "
            "own (grace.training)",
        )
        facts = _Facts(dataclasses.replace(facts.analysis, skip=reason), facts.mutated, facts.random_ops)
    record = torch_compat.InnerCompileRecord()
    compiled = torch_compat.compile_with_inductor(
        gm,
        example_inputs,
        record,
        need_inner_outputs=pi_prepare is not None,
        on_graph=training,
        keep_donated=options.donated_buffers,
    )
    unit = _Unit(gm, example_inputs, compiled, facts, pi_prepare, pi_note, tuple(record.output_codes))
    return _guarded(unit, stage, options, eager)


@dataclass(frozen=True)
class _Unit:
    """One compiled graph and what the backend learned of it, ready for a runner."""

    gm: torch.fx.GraphModule
    example_inputs: Sequence[Any]
    compiled: Callable[..., Any]
    facts: _Facts
    pi_prepare: Any
    pi_note: SkipReason | None
    output_codes: tuple[Any, ...]
    role: GraphRole = GraphRole.INFERENCE
    kept_from: int | None = None
    seed_outputs: tuple[int, ...] = ()
    undefined_outputs: tuple[int, ...] = ()


def _graph_hash(gm: torch.fx.GraphModule) -> str:
    try:
        return torch_compat.graph_code_hash(gm)
    except Exception as exc:  # a hash only names the graph: any stable text will do
        logger.debug("grace: hashing the graph failed", exc_info=exc)
        return f"unhashed-{id(gm):x}"


def _guarded(unit: _Unit, stage: _Stage, options: GraceOptions, eager: Callable[..., Any]) -> GuardedRunner:
    """The unit's runner behind its guard, published for ``grace.explain``."""
    graph_hash = _graph_hash(unit.gm)
    facts = unit.facts
    analysis, skip = facts.analysis, facts.analysis.skip
    counted = CountedCallable(unit.compiled)
    plan = RunnerPlan(
        graph_hash=graph_hash,
        device=analysis.device,
        static_indices=analysis.static_indices,
        dynamic_indices=analysis.dynamic_indices,
        scalar_indices=analysis.scalar_indices,
        mutated_indices=facts.mutated,
        skip=skip,
        output_codes=unit.output_codes,
        input_adapter=stage.adapter,
        pi_prepare=unit.pi_prepare,
        pi_unavailable=unit.pi_note,
        random_ops=facts.random_ops,
        role=unit.role,
        kept_from=unit.kept_from,
        seed_outputs=unit.seed_outputs,
        undefined_outputs=unit.undefined_outputs,
    )
    safe = SafePath(counted, stage.adapter, eager)
    try:
        environment = _environment(analysis.device) if skip is None and analysis.device is not None else None
        runner = GraceRunner(counted, plan, options, environment)
    except Exception as exc:
        reason = SkipReason(
            SkipCode.BACKEND_FAILED, f"building the runner raised {type(exc).__name__}: {exc}"
        )
        return GuardedRunner.failed(safe, graph_hash, reason)
    _publish(
        CompiledGraphInfo(
            callable_id=runner.callable_id,
            graph_hash=graph_hash,
            num_nodes=len(unit.gm.graph.nodes),
            num_inputs=len(unit.example_inputs),
            static_inputs=len(analysis.static_indices),
            dynamic_inputs=len(analysis.dynamic_indices),
            skip=skip,
            cgct_transformed=stage.transformed,
            cgct_note=stage.note,
            pi_note=unit.pi_note,
            diagnoses=stage.diagnoses,
            mutated_inputs=facts.mutated,
            role=unit.role.value,
        )
    )
    return GuardedRunner(runner, safe)


# --- training graphs (grace.training) ------------------------------------------------------


def _training_hook(facts: _Facts, options: GraceOptions) -> TrainingGraphs | None:
    """The inner-compile hook that gives a graph needing autograd runners for its forward and backward
    graphs, or None (another reason declined the graph, or option ``training`` is off)."""
    skip = facts.analysis.skip
    if skip is None or skip.code is not SkipCode.AUTOGRAD or not options.training:
        return None

    def build(inner: InnerGraph, found: InnerFacts, compiled: Callable[..., Any]) -> GuardedRunner:
        return _inner_runner(inner, found, compiled, options)

    return TrainingGraphs(build)


def _inner_runner(
    inner: InnerGraph, found: InnerFacts, compiled: Callable[..., Any], options: GraceOptions
) -> GuardedRunner:
    """A guarded runner for one graph of AOTAutograd's training pair (grace.training)."""
    example_inputs = list(inner.example_inputs)
    facts = _analyse(inner.gm, example_inputs, options)
    analysis = dataclasses.replace(
        facts.analysis, static_indices=found.static_indices, dynamic_indices=found.dynamic_indices
    )
    # A backward's donated inputs are written through memory reuse no op shows: they count as mutated.
    mutated = tuple(sorted(set(facts.mutated) | set(inner.donated)))
    facts = _Facts(analysis, mutated, facts.random_ops)
    pi_prepare, pi_note = _pi_seam(analysis.skip, options)
    compiled = philox.host_seeds(compiled, found.seed_inputs)  # Note: [Philox seeds of attention]
    unit = _Unit(
        inner.gm,
        example_inputs,
        compiled,
        facts,
        pi_prepare,
        pi_note,
        (inner.code_view(),),
        role=found.role,
        kept_from=found.kept_from,
        seed_outputs=found.seed_outputs,
        undefined_outputs=found.undefined_outputs,
    )
    return _guarded(unit, _Stage(inner.gm, example_inputs), options, eager=compiled)


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
    from grace import poolgroups, reasons, scg, stats
    from grace.runner import release_all

    release_all()
    poolgroups.forget_step_groups()
    stats.reset()
    reasons.reset_logged()
    scg.forget_caches()
    if torch_compat.cuda_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


grace_backend.reset = reset_runtime  # type: ignore[attr-defined]


def _register() -> None:
    """Register ``grace_backend`` as ``"grace"`` and make ``torch._dynamo.reset()`` reset grace too.

    Runs once, when this module is first imported: by ``import grace`` with torch imported, or by Dynamo
    loading the ``torch_dynamo_backends`` entry point (then the name is Dynamo's already)."""
    torch_compat.register_backend("grace", grace_backend)
    torch_compat.install_dynamo_reset_hook(reset_runtime)


_register()
