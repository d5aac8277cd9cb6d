"""The deciding call of a graph slot: capture the variants, check them, time them, keep one.

Problem: the first call after warm-up must turn a slot into its steady state without ever returning a
wrong result or applying the callable's side effects twice, and it must leave no memory behind for the
variants it drops.

Design (one call, on the caller's real inputs):
1. the no-graph reference runs first, so that no capture is the first run of the compiled code; a
   callable that writes its inputs gets them back after its reference state is kept, and one without
   side effects whose outputs reach option ``host_reference_bytes`` has them copied to host memory, with
   the no-graph variant's SCG samples taken at once (grace.hostref);
2. the graph variants of ``grace.variants`` are captured: with copies and, when PI is enabled and
   usable, a PI graph reading the same placeholders (Note: [PI seam] in grace.capture); under option
   ``pi_direct`` first the PI graph alone, on the caller's inputs (or on placeholders of its own
   where they cannot be borrowed), which stands alone when its PI serves every dynamic input;
3. each variant runs from the call's state (``grace.rerun.CallStart``) in its spec's check order and
   is dropped when its outputs or mutated inputs differ from the reference (PI first, with zeros in the
   placeholders it shares, then again with its inputs at new addresses: the placeholders);
4. choose (grace.choice): the only candidate; else the persisted decision for the same
   ``DecisionKey``; else time the candidates and store the decision. Callables that mutate their
   inputs are not timed: they keep the preferred graph variant. A PI graph that stood alone gets
   the graph with copies beside it when small inputs make copying a contender (Note: [Copies beside
   a PI graph alone]);
5. release the dropped graphs and return a ``SlotDecision``: the slot applies it (binds the graph,
   arms the safety net of grace.verify) and makes the call's last run, itself compared with the
   no-graph output and started from the call's state.

``decide`` reads the slot's facts (``SlotFacts``) and never writes the slot; the stats record gets the
reasons and node counts. A PI graph is handed to its plan's ``prepare_launch`` after instantiation;
the plan's ``health`` is part of every numeric check.

Invariant: every exit path yields a decision the slot can apply (a graph variant, no graph with a
reason, or deciding again after a write the analysis missed). Note: [Deciding-call memory] (the
accounting, with the figures measured, is in docs/design/runtime.md): at most one no-graph output is
alive beside the graphs' pools, none while the no-graph variant is timed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grace import choice, pools, variants
from grace.capture import CapturedGraph, CaptureError
from grace.compat import torch as torch_compat
from grace.hostref import kept_copy, offload
from grace.noise import allow_noise
from grace.reasons import SkipCode, SkipReason, log_once
from grace.rerun import CallStart, UnlistedWrites
from grace.runplan import SlotFacts
from grace.scg import (
    MUTATED,
    Decision,
    Variant,
    devices_differ,
    output_devices,
    outputs_match,
)
from grace.variants import VariantSpec, spec_of
from grace.verify import graph_health

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlotDecision:
    """What a deciding call settled, for the slot to apply (Note: [Slot states] in grace.runner).

    ``variant``: a graph variant (``graph`` is its graph), ``Variant.NO_GRAPH`` (``reason``: why, when
    no decision was made) or ``Variant.PENDING``: decide again on the next call, the inputs in
    ``written`` joining the written ones (``output``: this call's output). For no graph, ``output`` is
    the reference to return when it is this call's result, and ``ran`` says that it is even where it is
    None (a callable that returns nothing must not run again). ``start``: the call's state every further run
    starts from; ``host_reference``: the reference in host memory the returned replay is compared with;
    ``verify``: arm the safety net (grace.verify) for the graph's first replays."""

    variant: Variant
    graph: CapturedGraph | None = None
    decision: Decision | None = None
    reason: SkipReason | None = None
    written: tuple[int, ...] = ()
    output: Any = None
    start: CallStart | None = None
    host_reference: Any = None
    verify: bool = True
    noise: dict[str, float] = field(default_factory=dict)  # Note: [Run-to-run noise] in grace.noise
    ran: bool = False

    @classmethod
    def bind(cls, variant: Variant, graph: CapturedGraph) -> SlotDecision:
        """A graph checked elsewhere, bound as it is (no safety net): for stand-ins of the deciding call."""
        return cls(variant, graph=graph, verify=False)


@dataclass(frozen=True)
class Rebound:
    """What ``rebind_graph`` made: the graph, or None; ``block``: no more rebinds for the slot."""

    graph: CapturedGraph | None
    block: bool = False


def decide(facts: SlotFacts, args: Sequence[Any]) -> SlotDecision:
    """The deciding call of one slot on ``args`` (see the module docstring)."""
    mutated = list(facts.mutated)
    keep_bytes = facts.options.host_reference_bytes
    start = _call_start(facts, args, mutated)  # every run below starts from it (the rule in grace.rerun)
    if isinstance(start, SlotDecision):
        return start
    # The reference comes before any capture, so that no capture is the first run of the compiled code
    # (without warm-up, lazy first-run work, loading kernels or creating handles, would invalidate
    # it); one that writes its inputs gets them back after the reference state is kept.
    early = _reference_first(facts, args, start, writes_inputs=bool(mutated))
    if isinstance(early, _MissedWrite):
        return _decide_again(facts, start, early)
    reference_state: list[Any] = []
    if mutated:
        reference_state = kept_copy([args[i] for i in mutated], keep_bytes)
        start.restore()
    graphs, wanted, alone = _capture_variants(facts, args)

    reference, on_host, pretimed, devices = early
    del early  # ``reference`` is the only holder: it is dropped before the timing
    host_reference = reference if on_host else None
    checks = _Checks(facts, graphs)

    noise: dict[str, float] = {}

    def problem_of(variant: Variant) -> str | None:
        expected = (reference, reference_state, devices)
        return _check_variant(facts, spec_of(variant), graphs[variant], args, expected, start.restore, noise)

    # In each spec's check order; candidates keep the capture order (part of the persisted key).
    order = sorted(graphs, key=lambda v: spec_of(v).check_rank)
    problems = {v: problem_of(v) for v in order}
    problems = allow_noise(problems, problem_of, facts, args, reference, start, noise, reference_state)
    for variant in list(graphs):
        checks.keep_if_it_passes(variant, problems[variant])
    if alone and (len(checks.candidates) == 1 or _copies_could_win(facts, args, graphs, bool(mutated))):
        # The graph that stood alone failed, or SCG should time copies beside it (Note: [Copies beside
        # a PI graph alone]): capture the variants that need no other.
        _capture_the_rest(facts, args, graphs, wanted, set(problems), checks, problem_of)
    if len(checks.candidates) > 1 or host_reference is not None:
        # Note: [Deciding-call memory]: no reference output alive while the no-graph variant is timed
        # (and a reference in host memory is no output to return).
        reference = None
        reference_state = []

    decision = choice.choose_variant(
        facts, args, graphs, checks.candidates, checks.results, bool(mutated), pretimed
    )
    for variant, graph in graphs.items():
        if variant != decision.variant:
            graph.release()
    pools.mark_hand_back_due()  # what this call's runs left cached (Note: [Hand back before a capture])
    if decision.variant == Variant.NO_GRAPH:
        if len(checks.candidates) > 1:
            detail = ", ".join(f"{k} {v:.4f} ms" for k, v in decision.medians_ms.items())
            facts.record.add_skip(SkipReason(SkipCode.SCG_SLOWER, f"no graph is fastest ({detail})"))
        output = reference if not mutated else None
        return SlotDecision(Variant.NO_GRAPH, decision=decision, output=output, start=start)
    # Replays use the workspace in the graph's pool: the one the no-graph runs allocated is not needed
    # in the steady state (Note: [cuBLAS workspaces] in grace.capture).
    torch_compat.clear_cublas_workspaces()
    chosen = graphs[decision.variant]
    return SlotDecision(
        decision.variant,
        graph=chosen,
        decision=decision,
        start=start,
        host_reference=host_reference,
        noise=noise,
    )


def _call_start(facts: SlotFacts, args: Sequence[Any], mutated: list[int]) -> CallStart | SlotDecision:
    """The call's state for every run to start from, or no graph where the generators' state cannot be
    saved."""
    try:
        return CallStart(
            args,
            mutated,
            bool(facts.plan.random_ops),
            facts.plan.device,
            facts.options.host_reference_bytes,
            fingerprints=True,
        )
    except Exception as exc:
        ops = ", ".join(facts.plan.random_ops[:3])
        reason = SkipReason(
            SkipCode.RANDOM_STATE_UNKNOWN,
            f"the graph draws random numbers ({ops}) and the generators' state cannot be saved "
            f"({type(exc).__name__}: {exc}): extra runs would consume the caller's numbers",
        )
        return SlotDecision(Variant.NO_GRAPH, reason=reason)


def _copies_could_win(
    facts: SlotFacts, args: Sequence[Any], graphs: dict[Variant, CapturedGraph], mutates: bool
) -> bool:
    """Note: [Copies beside a PI graph alone]
    Under option ``pi_direct`` a PI graph that passes its checks stands alone, and SCG would weigh it
    against no graph only. Yet where the inputs are small, copying them into placeholders costs about
    what PI's table update and indirect loads cost, and either may be faster: SCG must time every
    variant that could win. So when SCG times this slot, the dynamic inputs and the PI graph's outputs
    each hold at most ``scg_copies_bytes``, the graph with copies is captured as well, checked, and
    timed beside it. The bound keeps the deciding call's memory near one set of outputs: a graph with
    large outputs (a training forward's saved tensors) never gets a second one."""
    limit = facts.options.scg_copies_bytes
    if mutates or not facts.options.scg or limit <= 0 or len(graphs) != 1:
        return False
    (graph,) = graphs.values()
    inputs = sum(args[i].nbytes for i in facts.plan.dynamic_indices if isinstance(args[i], torch.Tensor))
    return inputs <= limit and graph.output_bytes <= limit


def _capture_the_rest(
    facts: SlotFacts,
    args: Sequence[Any],
    graphs: dict[Variant, CapturedGraph],
    wanted: Sequence[VariantSpec],
    tried: set[Variant],
    checks: _Checks,
    problem_of: Callable[[Variant], str | None],
) -> None:
    for spec in (s for s in wanted if s.variant not in tried and not s.needs):
        graph = spec.capture(facts, args, graphs)
        if graph is not None:
            graphs[spec.variant] = graph
            checks.keep_if_it_passes(spec.variant, problem_of(spec.variant))


@dataclass
class _Checks:
    """The numeric checks of one deciding call and the variants that passed them."""

    facts: SlotFacts
    graphs: dict[Variant, CapturedGraph]
    results: dict[str, str] = field(default_factory=lambda: {Variant.NO_GRAPH.value: "reference"})
    candidates: list[Variant] = field(default_factory=lambda: [Variant.NO_GRAPH])

    def keep_if_it_passes(self, variant: Variant, problem: str | None) -> None:
        self.results[variant.value] = problem or "pass"
        if problem is None:
            self.candidates.append(variant)
            return
        code = SkipCode.REPLAY_FAILED if problem.startswith("replay failed") else SkipCode.NUMERIC_MISMATCH
        self.facts.record.add_skip(SkipReason(code, f"{variant.value}: {problem}"))
        self.graphs.pop(variant).release()


@dataclass(frozen=True)
class _MissedWrite:
    """The first run of a deciding call wrote inputs the analysis did not list; its output."""

    output: Any
    written: UnlistedWrites


def _decide_again(facts: SlotFacts, start: CallStart, missed: _MissedWrite) -> SlotDecision:
    """End the deciding call with its first (and only) run. Writes a version counter shows join the
    slot's written inputs, and the next call decides again (as after a warm-up call that saw them);
    writes only the contents show (a kernel writing memory no op declares) leave the slot without a
    graph (grace.rerun)."""
    written = missed.written
    if written.unseen:
        detail = (
            f"the first run changed inputs {list(written.unseen)} with no version counter moving: a kernel "
            "writes memory no op of the graph declares, so no graph is kept"
        )
        reason = SkipReason(SkipCode.UNLISTED_WRITE, detail)
        logger.warning("grace: graph %s: %s", facts.record.graph_id, detail)
        start.note_first_run()
        return SlotDecision(Variant.NO_GRAPH, reason=reason, output=missed.output, start=start, ran=True)
    detail = f"the first run wrote inputs {list(written.counted)} that the analysis did not list"
    logger.warning("grace: graph %s: %s; deciding again on the next call", facts.record.graph_id, detail)
    facts.record.add_skip(SkipReason(SkipCode.UNLISTED_WRITE, f"{detail}: they count as written from now on"))
    return SlotDecision(Variant.PENDING, written=written.counted, output=missed.output)


def _reference_first(
    facts: SlotFacts, args: Sequence[Any], start: CallStart, *, writes_inputs: bool
) -> tuple[Any, bool, list[float] | None, tuple[str, ...]] | _MissedWrite:
    """(reference, in host memory, no-graph SCG samples): the call's first run, before any capture.

    A callable that writes its inputs keeps its output on the device (the caller puts the inputs back
    after keeping what the run left in them). One without side effects has a large output moved to host
    memory, and only then are the no-graph samples taken here."""
    options = facts.options
    output = facts.compiled(*args)
    written = start.unexpected_writes()
    if written:
        return _MissedWrite(output, written)
    devices = output_devices(output)
    if writes_inputs:
        start.note_first_run()
        return output, False, None, devices
    value, on_host = offload(output, options.host_reference_bytes)
    del output
    start.note_first_run()
    if not (on_host and options.scg):
        return value, on_host, None, devices
    samples = choice.time_runs(facts, {Variant.NO_GRAPH: lambda: facts.compiled(*args)})
    return value, on_host, samples[Variant.NO_GRAPH], devices


def _capture_variants(
    facts: SlotFacts, args: Sequence[Any]
) -> tuple[dict[Variant, CapturedGraph], list[VariantSpec], bool]:
    """The graph variants to check, the specs the slot wants, and whether one graph stands alone: one
    spec's graph that does (option ``pi_direct``: the PI graph captured on the caller's inputs, or on
    placeholders of its own, Note: [A PI graph alone] in grace.variants), else every wanted spec whose
    ``needs`` were captured, in capture order."""
    wanted = [spec for spec in variants.specs() if spec.wanted(facts)]
    for spec in wanted:
        alone = spec.capture_alone(facts, args)
        if alone is not None:
            return {spec.variant: alone}, wanted, True
    graphs: dict[Variant, CapturedGraph] = {}
    for spec in wanted:
        if all(v in graphs for v in spec.needs):
            graph = spec.capture(facts, args, graphs)
            if graph is not None:
                graphs[spec.variant] = graph
    return graphs, wanted, False


def _check_variant(
    facts: SlotFacts,
    spec: VariantSpec,
    graph: CapturedGraph,
    args: Sequence[Any],
    expected: tuple[Any, list[torch.Tensor], tuple[str, ...]],
    restore: Callable[[], None],
    noise: dict[str, float],
) -> str | None:
    """What differs between a replay of ``graph`` and the no-graph run: ``expected`` holds its output
    (perhaps in host memory), the mutated inputs it left and the devices its outputs were on."""
    if not facts.options.check_numerics:
        return None
    reference, reference_state, devices = expected
    mutated = list(facts.mutated)
    restore()
    spec.prepare_check(graph)
    try:
        out = spec.replay(graph, args, False)
        torch.cuda.synchronize(graph.device)
    except Exception as exc:
        return f"replay failed: {type(exc).__name__}: {exc}"
    problem = devices_differ(output_devices(out), devices, facts.plan.seed_outputs)
    if problem is None:
        problem = outputs_match(reference, out, noise=noise, undefined=facts.plan.undefined_outputs)
    if problem is None and mutated:
        problem = outputs_match(reference_state, [args[i] for i in mutated], "mutated input", noise, MUTATED)
    if problem is None:
        problem = graph_health(graph)
    if problem is None and spec.checks_new_addresses(graph, bool(mutated)):
        undefined = facts.plan.undefined_outputs
        problem = _check_at_new_addresses(spec, graph, args, reference, restore, noise, undefined)
    return problem


def _check_at_new_addresses(
    spec: VariantSpec,
    graph: CapturedGraph,
    args: Sequence[Any],
    reference: Any,
    restore: Callable[[], None],
    noise: dict[str, float],
    undefined: Sequence[int],
) -> str | None:
    """Run again on the same values elsewhere. The placeholders are such a place (other addresses than
    ``args``, the inputs' exact layout), so no clone of the inputs is made (Note: [Deciding-call
    memory])."""
    graph.copy_in(args, graph.copy_indices)
    moved = list(args)
    for i in graph.copy_indices:
        moved[i] = graph.placeholders[i]
    restore()  # the generators as the call found them (no input is written here)
    try:
        out_moved = spec.replay(graph, moved, False)
        torch.cuda.synchronize(graph.device)
    except Exception as exc:
        return f"replay failed at new input addresses: {type(exc).__name__}: {exc}"
    problem = outputs_match(
        reference, out_moved, "output at new input addresses", noise, undefined=undefined
    ) or graph_health(graph)
    if graph.pi_plan is not None:
        graph.pi_plan.update(args)
    return problem


def rebind_graph(facts: SlotFacts, current: CapturedGraph, variant: Variant, args: Sequence[Any]) -> Rebound:
    """``current`` made to read its static inputs where ``args`` has them (grace.rebind), as ``variant``;
    no graph, with the reason recorded, when it cannot (the slot then captures again)."""
    origin = current.outputs_owner  # the captured graph of the family
    if origin.outputs_read_by(args, facts.plan.dynamic_indices):
        # Note: [Layers that hold each other's outputs] (grace.rebind)
        _decline(
            facts,
            SkipReason(
                SkipCode.REBIND_DECLINED,
                "an output of the graph is an input of the call that moved the parameters (one layer's "
                "result feeds the next): graphs sharing outputs would overwrite it",
            ),
        )
        return Rebound(None, block=True)
    spec = variants.REGISTRY.get(variant) or spec_of(Variant.GRAPH_COPIES)
    try:
        return Rebound(spec.rebind(facts, origin, args))
    except CaptureError as exc:
        _decline(facts, exc.reason)
        return Rebound(None)


def _decline(facts: SlotFacts, reason: SkipReason) -> None:
    facts.record.add_skip(reason)
    log_once(reason, f"graph {facts.record.graph_id} ({facts.signature_text})")
