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
   ``pi_direct`` first the PI graph alone, on the caller's inputs, which stands alone when its PI
   serves every dynamic input;
3. each variant runs from the call's state (``grace.rerun.CallStart``) in its spec's check order and
   is dropped when its outputs or mutated inputs differ from the reference (PI first, with zeros in the
   placeholders it shares, then again with its inputs at new addresses: the placeholders);
4. choose: the only candidate; else the persisted decision for the same ``DecisionKey``; else time the
   candidates (``grace.scg.time_variants``) and store the decision. Callables that mutate their inputs
   are not timed: they keep the preferred graph variant;
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from grace.capture import (
    CaptureContext,
    CapturedGraph,
    CaptureError,
    GraphHook,
    StorageSpan,
    capture_graph,
    dense_view,
    poison_placeholders,
    summary_hook,
)
from grace.compat import torch as torch_compat
from grace.hostref import kept_copy, offload
from grace.reasons import SkipCode, SkipReason, log_once
from grace.rerun import CallStart
from grace.scg import (
    Decision,
    DecisionSource,
    Variant,
    choose,
    decision_cache,
    medians,
    outputs_match,
    time_variants,
)
from grace.verify import graph_health, synchronize

if TYPE_CHECKING:
    from grace.runner import GraphSlot

logger = logging.getLogger(__name__)

_GRAPH_PREFERENCE = (Variant.GRAPH_PI, Variant.GRAPH_COPIES)
_CHECK_ORDER = (Variant.GRAPH_PI, Variant.GRAPH_COPIES)
# Each timed no-graph run starts without a cuBLAS workspace, as a stream's first run does, instead of
# holding one beside its cuDNN convolutions' transient ones (Note: [cuBLAS workspaces] in grace.capture).
_FRESH_WORKSPACE = {Variant.NO_GRAPH: torch_compat.clear_cublas_workspaces}


def decide(slot: GraphSlot, args: Sequence[Any]) -> Any:
    runner = slot.runner
    record = slot.record
    mutated = sorted(slot.mutated)
    keep_bytes = runner.options.host_reference_bytes
    try:  # every run below starts from the call's state (the rule in grace.rerun)
        start = CallStart(args, mutated, bool(runner.plan.random_ops), runner.plan.device, keep_bytes)
    except Exception as exc:
        ops = ", ".join(runner.plan.random_ops[:3])
        slot.set_no_graph(
            SkipReason(
                SkipCode.RANDOM_STATE_UNKNOWN,
                f"the graph draws random numbers ({ops}) and the generators' state cannot be saved "
                f"({type(exc).__name__}: {exc}): extra runs would consume the caller's numbers",
            )
        )
        return slot.run(args)
    restore = start.restore

    # The reference comes before any capture, so that no capture is the first run of the compiled code
    # (without warm-up, lazy first-run work, loading kernels or creating handles, would invalidate
    # it): for a callable without side effects in host memory when its outputs are large, with the
    # no-graph variant's samples (Note: [Deciding-call memory]); one that writes its inputs gets them
    # back after the reference state is kept.
    early = _reference_first(slot, args, start) if not mutated else _written_reference(slot, args, start)
    if isinstance(early, _MissedWrite):
        return _stop_for_missed_write(slot, start, early.output)
    reference_state: list[Any] = []
    if mutated:
        reference_state = kept_copy([args[i] for i in mutated], keep_bytes)
        restore()
    graphs = _capture_variants(slot, args, mutated)
    direct = any(g.borrowed for g in graphs.values())

    reference, on_host, pretimed = early
    del early  # ``reference`` is the only holder: it is dropped before the timing
    host_reference = reference if on_host else None
    checks: dict[str, str] = {Variant.NO_GRAPH.value: "reference"}
    candidates = [Variant.NO_GRAPH]

    def problem_of(variant: Variant, graph: CapturedGraph) -> str | None:
        return _check_variant(slot, variant, graph, args, reference, reference_state, mutated, restore)

    def keep_if_it_passes(variant: Variant, graph: CapturedGraph, problem: str | None) -> None:
        checks[variant.value] = problem or "pass"
        if problem is None:
            candidates.append(variant)
            return
        code = SkipCode.REPLAY_FAILED if problem.startswith("replay failed") else SkipCode.NUMERIC_MISMATCH
        record.add_skip(SkipReason(code, f"{variant.value}: {problem}"))
        graph.release()
        del graphs[variant]

    # PI first: the placeholders it shares with the copies graph hold no copied input yet. Candidates
    # keep the capture order (it is part of the persisted decision key).
    problems = {v: problem_of(v, graphs[v]) for v in sorted(graphs, key=_CHECK_ORDER.index)}
    for variant, graph in list(graphs.items()):
        keep_if_it_passes(variant, graph, problems[variant])
    if direct and len(candidates) == 1:
        # The PI graph read on the caller's inputs failed: the graph with copies is the other graph.
        copies = _capture_copies(slot, args, mutated)
        if copies is not None:
            graphs[Variant.GRAPH_COPIES] = copies
            keep_if_it_passes(Variant.GRAPH_COPIES, copies, problem_of(Variant.GRAPH_COPIES, copies))
    if len(candidates) > 1 or host_reference is not None:
        # Note: [Deciding-call memory]: no reference output alive while the no-graph variant is timed
        # (and a reference in host memory is no output to return).
        reference = None
        reference_state = []

    decision = _choose(slot, args, graphs, candidates, checks, bool(mutated), pretimed)
    for variant, graph in graphs.items():
        if variant != decision.variant:
            graph.release()
    record.decision = decision
    slot.decision = decision
    if decision.variant == Variant.NO_GRAPH:
        if len(candidates) > 1:
            detail = ", ".join(f"{k} {v:.4f} ms" for k, v in decision.medians_ms.items())
            record.add_skip(SkipReason(SkipCode.SCG_SLOWER, f"no graph is fastest ({detail})"))
        slot.set_no_graph(None)
        if not mutated:
            record.calls += 1
            if reference is not None:
                start.resume_first_run()  # the generators where the run that made it left them
                return reference
            restore()
            return runner.compiled(*args)
        restore()
        return slot.run(args)

    chosen = graphs[decision.variant]
    # Replays use the workspace in the graph's pool: the one the no-graph runs allocated is not needed
    # in the steady state (Note: [cuBLAS workspaces] in grace.capture).
    torch_compat.clear_cublas_workspaces()
    slot.graph = chosen
    slot.note_graphs()
    record.variant = decision.variant
    record.copy_bytes_per_replay = _copied_bytes(chosen, decision.variant)
    record.copy_launches_per_replay = _copy_launches(chosen, decision.variant)
    slot.run = slot._run_pi if decision.variant == Variant.GRAPH_PI else slot._run_copies
    if host_reference is None:
        slot.arm_verification(args)  # this call's replay, the first steady one, the first at new addresses
        restore()
        return slot.run(args)
    # This call's replay is compared with the host reference (same inputs, no side effects) and the
    # first call at new addresses with the no-graph callable; no no-graph run while the graph lives.
    slot.arm_verification(args, calls=0)
    return _returned_replay(slot, args, host_reference, start)


@dataclass(frozen=True)
class _MissedWrite:
    """The first run of a deciding call wrote an input the analysis did not list; its output."""

    output: Any


def _stop_for_missed_write(slot: GraphSlot, start: CallStart, output: Any) -> Any:
    """End the deciding call with its first (and only) run: the inputs it wrote join the slot's written
    inputs, and the next call decides again (as after a warm-up call that saw the writes)."""
    written = start.unexpected_writes()
    slot.mutated.update(written)
    slot.record.calls += 1
    slot.warmups_left = 0
    slot.run = slot._run_warmup  # also after a capture for moved static inputs: no graph is bound
    logger.warning(
        "grace: graph %s wrote inputs %s that the analysis did not find; deciding again on the next call",
        slot.record.graph_id,
        written,
    )
    return output


def _reference_first(
    slot: GraphSlot, args: Sequence[Any], start: CallStart
) -> tuple[Any, bool, list[float] | None] | _MissedWrite:
    """(reference, in host memory, no-graph SCG samples) for a callable without side effects, run
    before any capture: the samples are taken then only for a reference held in host memory."""
    runner = slot.runner
    options = runner.options
    output = runner.compiled(*args)
    if start.unexpected_writes():
        return _MissedWrite(output)
    value, on_host = offload(output, options.host_reference_bytes)
    del output
    start.note_first_run()
    if not (on_host and options.scg):
        return value, on_host, None
    samples = _time(slot, {Variant.NO_GRAPH: lambda: runner.compiled(*args)})
    return value, on_host, samples[Variant.NO_GRAPH]


def _written_reference(
    slot: GraphSlot, args: Sequence[Any], start: CallStart
) -> tuple[Any, bool, None] | _MissedWrite:
    """The reference of a callable that writes its inputs: its first run in the call, before any capture
    (the caller puts the inputs back after keeping what the run left in them)."""
    output = slot.runner.compiled(*args)
    if start.unexpected_writes():
        return _MissedWrite(output)
    start.note_first_run()
    return output, False, None


def _time(slot: GraphSlot, runs: dict[Variant, Callable[[], Any]]) -> dict[Variant, list[float]]:
    """SCG's samples of ``runs`` with the slot's options, each no-graph run without a cuBLAS workspace."""
    options = slot.runner.options
    return time_variants(
        runs,
        samples=options.scg_samples,
        warmup=options.scg_warmup,
        device=slot.runner.plan.device,
        untimed_setup=_FRESH_WORKSPACE,
    )


def _returned_replay(slot: GraphSlot, args: Sequence[Any], host_reference: Any, start: CallStart) -> Any:
    """The deciding call's replay, compared with the reference held in host memory; the no-graph
    callable's output instead (and no graph from now on) when they differ. Each run starts from the
    call's state (``start``)."""
    graph = slot.graph
    start.restore()
    out = slot.run(args)
    if slot.graph is not graph or graph is None or not slot.runner.options.check_numerics:
        return out  # (a failed replay already left the slot without a graph)
    synchronize(graph.device)
    problem = outputs_match(host_reference, out) or graph_health(graph)
    if problem is None:
        return out
    slot.drop_for_mismatch(slot.record.variant, "deciding call's replay", problem)
    start.restore()
    return slot.runner.compiled(*args)


def _capture_variants(
    slot: GraphSlot, args: Sequence[Any], mutated: list[int]
) -> dict[Variant, CapturedGraph]:
    """The graph variants to check: with copies and with PI; or, under option ``pi_direct``, only the PI
    graph captured on the caller's inputs when its PI serves every dynamic input."""
    try_pi = _pi_wanted(slot)
    if try_pi and slot.runner.options.pi_direct:
        direct = _capture_pi(slot, args, mutated, borrow=True)
        if direct is not None:
            return {Variant.GRAPH_PI: direct}
    copies = _capture_copies(slot, args, mutated)
    if copies is None:
        return {}
    graphs = {Variant.GRAPH_COPIES: copies}
    if try_pi:
        pi_graph = _capture_pi(slot, args, mutated, shared=copies.placeholders)
        if pi_graph is not None:
            graphs[Variant.GRAPH_PI] = pi_graph
    return graphs


def _pi_wanted(slot: GraphSlot) -> bool:
    """Whether to capture a PI graph; records why not where PI was asked for and cannot be used."""
    runner = slot.runner
    plan = runner.plan
    if not runner.options.pi:
        return False
    if plan.pi_prepare is None:
        if plan.pi_unavailable is not None:
            slot.record.add_skip(plan.pi_unavailable)
        return False
    if not plan.dynamic_indices:
        slot.record.add_skip(SkipReason(SkipCode.PI_NO_DYNAMIC_INPUTS, "every tensor input is static"))
        return False
    return True


def _record_summary(slot: GraphSlot, sink: dict[str, Any]) -> None:
    record = slot.record
    summary = sink.get("summary")
    if summary is not None:
        record.kernel_nodes = summary.kernel_nodes
        record.launch_nodes = sum(summary.by_type.get(t, 0) for t in ("kernel", "memset", "memcpy"))
        record.node_types = dict(summary.by_type)
    elif "summary_error" in sink:
        logger.debug("grace: no node counts for %s: %s", record.graph_id, sink["summary_error"])


def _capture_copies(slot: GraphSlot, args: Sequence[Any], mutated: list[int]) -> CapturedGraph | None:
    runner = slot.runner
    plan = runner.plan
    assert plan.device is not None
    sink: dict[str, Any] = {}
    try:
        graph = capture_graph(
            runner.compiled,
            args,
            device=plan.device,
            dynamic_indices=plan.dynamic_indices,
            static_indices=plan.static_indices,
            mutated_indices=mutated,
            hooks=[summary_hook(sink)],
            keep_pristine=_keeps_pristine(slot),
        )
    except CaptureError as exc:
        _decline(slot, exc.reason)
        return None
    _record_summary(slot, sink)
    return graph


def _capture_pi(
    slot: GraphSlot,
    args: Sequence[Any],
    mutated: list[int],
    *,
    borrow: bool = False,
    shared: dict[int, torch.Tensor] | None = None,
) -> CapturedGraph | None:
    """The PI graph, read from ``shared`` placeholders or (``borrow``) from the caller's inputs; None with
    the reason recorded when PI cannot serve it (a borrowed capture also when one input keeps a copy)."""
    runner = slot.runner
    plan = runner.plan
    record = slot.record
    device = plan.device
    assert device is not None
    holder: dict[str, Any] = {}
    sink: dict[str, Any] = {}
    pi_hook = _pi_hook(slot, args, holder)
    try:
        pi_graph = capture_graph(
            runner.compiled,
            args,
            device=device,
            dynamic_indices=plan.dynamic_indices,
            static_indices=plan.static_indices,
            mutated_indices=mutated,
            hooks=[summary_hook(sink), pi_hook] if borrow else [pi_hook],
            placeholders=shared,  # Note: [Deciding-call memory]
            borrow_inputs=borrow,
            keep_pristine=_keeps_pristine(slot),
        )
    except CaptureError as exc:
        if borrow:
            record.add_skip(SkipReason(SkipCode.PI_DIRECT_DECLINED, f"capture: {exc.reason}"))
        else:
            record.add_skip(SkipReason(SkipCode.PI_FAILED, f"capture for PI: {exc.reason}"))
        return None
    if not _adopt_pi(slot, pi_graph, holder.get("result"), borrow):
        return None
    if borrow:
        _record_summary(slot, sink)
    return pi_graph


def _pi_hook(
    slot: GraphSlot, args: Sequence[Any], holder: dict[str, Any], spans: dict[int, StorageSpan] | None = None
) -> GraphHook:
    """A capture hook that prepares PI for the graph and leaves the plan (or a ``SkipReason``) in
    ``holder["result"]``; ``spans``: where the graph reads its dynamic inputs, when not the placeholders."""
    runner = slot.runner
    plan = runner.plan
    device = plan.device
    assert device is not None
    prepare = plan.pi_prepare
    assert prepare is not None

    def pi_hook(handle: int, placeholders: Any) -> None:
        ctx = CaptureContext(
            graph_handle=handle,
            placeholders=dict(placeholders),
            dynamic_input_indices=plan.dynamic_indices,
            compiled=runner.compiled,
            output_codes=plan.output_codes,
            device=device,
            example_inputs=tuple(args),
            pi_table_update=runner.options.pi_table_update,
            placeholder_spans=spans,
        )
        try:
            holder["result"] = prepare(ctx)
        except Exception as exc:  # a PI failure must only cost PI
            holder["result"] = SkipReason(SkipCode.PI_FAILED, f"prepare raised {type(exc).__name__}: {exc}")

    return pi_hook


def _adopt_pi(slot: GraphSlot, pi_graph: CapturedGraph, result: Any, borrow: bool) -> bool:
    """Give ``pi_graph`` the plan its hook prepared and ready its first launch; False (the graph
    released, the reason recorded) when PI cannot serve it, or a graph read on the caller's inputs
    would keep a copy of one."""
    record = slot.record
    device = pi_graph.device
    if result is None or isinstance(result, SkipReason):
        reason = (
            result
            if isinstance(result, SkipReason)
            else SkipReason(SkipCode.PI_FAILED, "prepare returned nothing")
        )
        if borrow:  # the capture with placeholders tries again, and records its own reason
            reason = SkipReason(SkipCode.PI_DIRECT_DECLINED, str(reason))
        record.add_skip(reason)
        log_once(reason, f"graph {record.graph_id} (PI)")
        pi_graph.release()
        return False
    uncovered = tuple(getattr(result, "uncovered_indices", ()))
    if borrow and uncovered:
        # Such an input is read at its capture address: the caller's tensor, which must never be
        # copied into. Capture again with placeholders.
        why = "; ".join(
            f"input {i}: {r}" for i, r in sorted(getattr(result, "uncovered_reasons", {}).items())
        )
        record.add_skip(
            SkipReason(SkipCode.PI_DIRECT_DECLINED, f"inputs {list(uncovered)} keep a copy ({why})")
        )
        pi_graph.pi_plan = result
        pi_graph.release()  # with its plan (the table, a fill node's module)
        return False
    pi_graph.pi_plan = result
    prepare_launch = getattr(result, "prepare_launch", None)
    if callable(prepare_launch):
        try:
            stream = torch.cuda.current_stream(device)
            prepare_launch(torch_compat.graph_exec_handle(pi_graph.graph), int(stream.cuda_stream))
            stream.synchronize()
        except Exception as exc:
            record.add_skip(
                SkipReason(SkipCode.PI_FAILED, f"preparing the first launch: {type(exc).__name__}: {exc}")
            )
            pi_graph.release()
            return False
    record.pi_bytes_per_replay = int(getattr(result, "bytes_per_replay", 0))
    record.pi_stages = [tuple(s) for s in getattr(result, "stages", [])]  # type: ignore[misc]
    return True


def _keeps_pristine(slot: GraphSlot) -> bool:
    """Whether captures of this slot keep a copy of their graph for grace.rebind."""
    runner = slot.runner
    return runner.options.rebind and bool(runner.plan.static_indices) and not runner.plan.random_ops


def rebind_graph(slot: GraphSlot, args: Sequence[Any]) -> CapturedGraph | None:
    """The slot's graph made to read its static inputs where ``args`` has them (grace.rebind), with the
    same variant; None, with the reason recorded, when it cannot (the runner then captures again)."""
    from grace.rebind import rebind

    current = slot.graph
    assert current is not None
    origin = current.outputs_owner  # the captured graph of the family
    variant = slot.record.variant
    if origin.outputs_read_by(args, slot.runner.plan.dynamic_indices):
        # Note: [Layers that hold each other's outputs] (grace.rebind)
        slot.rebind_blocked = True
        _decline(
            slot,
            SkipReason(
                SkipCode.REBIND_DECLINED,
                "an output of the graph is an input of the call that moved the parameters (one layer's "
                "result feeds the next): graphs sharing outputs would overwrite it",
            ),
        )
        return None
    holder: dict[str, Any] = {}
    hooks = [_pi_hook(slot, args, holder, dict(origin.capture_spans))] if variant == Variant.GRAPH_PI else []
    try:
        graph = rebind(origin, args, hooks, slot.runner.plan.random_ops)
    except CaptureError as exc:
        _decline(slot, exc.reason)
        return None
    if variant == Variant.GRAPH_PI and not _adopt_pi(slot, graph, holder.get("result"), graph.borrowed):
        return None
    return graph


def _decline(slot: GraphSlot, reason: SkipReason) -> None:
    slot.record.add_skip(reason)
    log_once(reason, f"graph {slot.record.graph_id} ({slot.signature_text})")


def _run_variant(slot: GraphSlot, variant: Variant, graph: CapturedGraph, args: Sequence[Any]) -> Any:
    if variant == Variant.GRAPH_PI:
        return graph.run_with_pi(args, False)
    return graph.run_with_copies(args, False)


def _check_variant(
    slot: GraphSlot,
    variant: Variant,
    graph: CapturedGraph,
    args: Sequence[Any],
    reference: Any,
    reference_state: list[torch.Tensor],
    mutated: list[int],
    restore: Callable[[], None],
) -> str | None:
    if not slot.runner.options.check_numerics:
        return None
    restore()
    if variant == Variant.GRAPH_PI:
        # A PI slot stuck at its capture address reads a placeholder; if that memory happens to hold the
        # inputs' values (reused from them, or copied by the copies graph) it would pass. Zeros fail it.
        poison_placeholders(graph.placeholders)
    try:
        out = _run_variant(slot, variant, graph, args)
        torch.cuda.synchronize(graph.device)
    except Exception as exc:
        return f"replay failed: {type(exc).__name__}: {exc}"
    problem = outputs_match(reference, out)
    if problem is None and mutated:
        problem = outputs_match(reference_state, [args[i] for i in mutated], "mutated input")
    if problem is None:
        problem = graph_health(graph)
    if problem is None and variant == Variant.GRAPH_PI and not mutated and not graph.borrowed:
        # PI must follow inputs to new addresses: run again on the same values elsewhere. The
        # placeholders are such a place (other addresses than ``args``, the inputs' exact layout), so
        # no clone of the inputs is made (Note: [Deciding-call memory]). A graph captured on the
        # caller's inputs has none: its first call at other addresses is compared with the no-graph
        # callable by the runner (grace.verify), as every kept graph's is.
        graph.copy_in(args, graph.copy_indices)
        moved = list(args)
        for i in graph.copy_indices:
            moved[i] = graph.placeholders[i]
        restore()  # the generators as the call found them (no input is written here)
        try:
            out_moved = _run_variant(slot, variant, graph, moved)
            torch.cuda.synchronize(graph.device)
        except Exception as exc:
            return f"replay failed at new input addresses: {type(exc).__name__}: {exc}"
        problem = outputs_match(reference, out_moved, "output at new input addresses") or graph_health(graph)
        if graph.pi_plan is not None:
            graph.pi_plan.update(args)
    return problem


def _choose(
    slot: GraphSlot,
    args: Sequence[Any],
    graphs: dict[Variant, CapturedGraph],
    candidates: list[Variant],
    checks: dict[str, str],
    mutates: bool,
    no_graph_samples: list[float] | None = None,
) -> Decision:
    runner = slot.runner
    options = runner.options
    if len(candidates) == 1:
        return Decision(Variant.NO_GRAPH, DecisionSource.ONLY_CANDIDATE, numeric_checks=checks)
    best_graph = next(v for v in _GRAPH_PREFERENCE if v in candidates)
    if not options.scg:
        return Decision(best_graph, DecisionSource.SCG_OFF, numeric_checks=checks)
    if mutates:
        return Decision(best_graph, DecisionSource.NOT_PROFILED_MUTATION, numeric_checks=checks)
    previous = slot.decision
    if (
        previous is not None
        and previous.variant in candidates
        and previous.source != DecisionSource.ONLY_CANDIDATE
    ):
        return previous
    key = runner.decision_key(slot, candidates)
    cache = decision_cache(options.resolved_cache_dir()) if (options.persist_decisions and key) else None
    if cache is not None and key is not None:
        entry = cache.lookup(key)
        if entry is not None:
            try:
                variant = Variant(entry["variant"])
            except (KeyError, ValueError):
                variant = Variant.PENDING
            if variant in candidates:
                return Decision(
                    variant,
                    DecisionSource.CACHE,
                    medians_ms=dict(entry.get("medians_ms", {})),
                    numeric_checks=checks,
                    key=key.digest,
                )
    runs: dict[Variant, Callable[[], Any]] = {}
    if no_graph_samples is None:
        runs[Variant.NO_GRAPH] = lambda: runner.compiled(*args)
    for variant, graph in graphs.items():
        if variant in candidates:
            runs[variant] = _bound_run(slot, variant, graph, args)
    timed = _time(slot, runs)
    # No-graph samples taken before the capture (_reference_first) join the graphs' own.
    samples = {Variant.NO_GRAPH: no_graph_samples, **timed} if no_graph_samples is not None else timed
    med = medians(samples)
    decision = Decision(
        choose(med),
        DecisionSource.PROFILED,
        medians_ms={v.value: m for v, m in med.items()},
        samples_ms={v.value: tuple(s) for v, s in samples.items()},
        numeric_checks=checks,
        key=key.digest if key else None,
    )
    if cache is not None and key is not None:
        cache.store(key, decision)
    return decision


def _bound_run(
    slot: GraphSlot, variant: Variant, graph: CapturedGraph, args: Sequence[Any]
) -> Callable[[], Any]:
    def run() -> Any:
        return _run_variant(slot, variant, graph, args)

    return run


def _copied_bytes(graph: CapturedGraph, variant: Variant) -> int:
    if variant == Variant.GRAPH_PI and graph.pi_plan is not None:
        uncovered = set(graph.pi_plan.uncovered_indices)
        return sum(dense_view(graph.placeholders[i]).nbytes for i in graph.copy_indices if i in uncovered)
    return graph.copy_bytes


def _copy_launches(graph: CapturedGraph, variant: Variant) -> int:
    indices: Sequence[int] = graph.copy_indices
    if variant == Variant.GRAPH_PI and graph.pi_plan is not None:
        uncovered = set(graph.pi_plan.uncovered_indices)
        indices = [i for i in indices if i in uncovered]
    copies = 1 if len(indices) > 1 and hasattr(torch, "_foreach_copy_") else len(indices)
    return copies + len([i for i in graph.mutated_indices if i in indices])
