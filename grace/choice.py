"""SCG's choice in a deciding call: which checked variant a slot keeps, and the timing behind it.

Problem: once the deciding call (grace.decide) has the variants that passed their numeric checks, one
must be kept. Timing them costs runs on the caller's inputs, a decision made before (for other
static-input addresses, or persisted by an earlier process) should not be timed again, and a callable
that writes its inputs must not be run more often than its checks already ran it.

Design: ``choose_variant`` takes the candidates in capture order (no graph first) and returns a
``grace.scg.Decision``: the only candidate; the preferred graph variant when SCG is off or the
callable writes its inputs; the slot's previous decision when it still applies; the persisted one for
the same ``DecisionKey`` (its choice made again from its medians with the current ``scg_margin``);
else every candidate timed by ``time_runs`` (``grace.scg.time_variants`` with the slot's options, each
no-graph run without a cuBLAS workspace) and chosen by ``grace.scg.choose``, and the decision stored.

Invariant: only candidates are ever returned, and nothing here runs a callable that writes its inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from grace.capture import CapturedGraph
from grace.compat import torch as torch_compat
from grace.runplan import SlotFacts
from grace.scg import Decision, DecisionSource, Variant, choose, decision_cache, medians, time_variants
from grace.variants import VariantSpec, spec_of

# Each timed no-graph run starts without a cuBLAS workspace, as a stream's first run does, instead of
# holding one beside its cuDNN convolutions' transient ones (Note: [cuBLAS workspaces] in grace.capture).
_FRESH_WORKSPACE = {Variant.NO_GRAPH: torch_compat.clear_cublas_workspaces}


def time_runs(facts: SlotFacts, runs: dict[Variant, Callable[[], Any]]) -> dict[Variant, list[float]]:
    """SCG's samples of ``runs`` with the slot's options, each no-graph run without a cuBLAS workspace."""
    options = facts.options
    return time_variants(
        runs,
        samples=options.scg_samples,
        warmup=options.scg_warmup,
        device=facts.plan.device,
        untimed_setup=_FRESH_WORKSPACE,
    )


def choose_variant(
    facts: SlotFacts,
    args: Sequence[Any],
    graphs: dict[Variant, CapturedGraph],
    candidates: list[Variant],
    results: dict[str, str],
    mutates: bool,
    no_graph_samples: list[float] | None = None,
) -> Decision:
    """The decision among ``candidates`` (module docstring); ``results``: each variant's check result;
    ``no_graph_samples``: no-graph samples taken before any capture (grace.decide), joined to the rest."""
    options = facts.options
    if len(candidates) == 1:
        return Decision(Variant.NO_GRAPH, DecisionSource.ONLY_CANDIDATE, numeric_checks=results)
    best_graph = min(candidates[1:], key=lambda v: spec_of(v).preference)
    if not options.scg:
        return Decision(best_graph, DecisionSource.SCG_OFF, numeric_checks=results)
    if mutates:
        return Decision(best_graph, DecisionSource.NOT_PROFILED_MUTATION, numeric_checks=results)
    previous = facts.previous
    if (
        previous is not None
        and previous.variant in candidates
        and previous.source != DecisionSource.ONLY_CANDIDATE
    ):
        return previous
    key = facts.decision_key(candidates)
    cache = decision_cache(options.resolved_cache_dir()) if (options.persist_decisions and key) else None
    if cache is not None and key is not None:
        cached = cached_decision(cache.lookup(key), candidates, results, key.digest, options.scg_margin)
        if cached is not None:
            return cached
    runs: dict[Variant, Callable[[], Any]] = {}
    if no_graph_samples is None:
        runs[Variant.NO_GRAPH] = lambda: facts.compiled(*args)
    for variant, graph in graphs.items():
        if variant in candidates:
            runs[variant] = _bound_run(spec_of(variant), graph, args)
    timed = time_runs(facts, runs)
    samples = {Variant.NO_GRAPH: no_graph_samples, **timed} if no_graph_samples is not None else timed
    med = medians(samples)
    decision = Decision(
        choose(med, options.scg_margin),
        DecisionSource.PROFILED,
        medians_ms={v.value: m for v, m in med.items()},
        samples_ms={v.value: tuple(s) for v, s in samples.items()},
        numeric_checks=results,
        key=key.digest if key else None,
    )
    if cache is not None and key is not None:
        cache.store(key, decision)
    return decision


def cached_decision(
    entry: dict[str, Any] | None,
    candidates: list[Variant],
    results: dict[str, str],
    digest: str,
    margin: float,
) -> Decision | None:
    """The persisted decision for this call's candidates: chosen again from its medians with the
    current ``scg_margin`` where it timed every candidate (the stored choice may have been made with
    another margin), else the stored variant; None when that is no candidate now."""
    if entry is None:
        return None
    medians_ms = dict(entry.get("medians_ms", {}))
    timed = {v: medians_ms.get(v.value) for v in candidates}
    if all(isinstance(m, (int, float)) for m in timed.values()):
        variant = choose({v: float(m) for v, m in timed.items() if m is not None}, margin)
    else:
        try:
            variant = Variant(entry["variant"])
        except (KeyError, ValueError):
            variant = Variant.PENDING
    if variant not in candidates:
        return None
    return Decision(variant, DecisionSource.CACHE, medians_ms=medians_ms, numeric_checks=results, key=digest)


def _bound_run(spec: VariantSpec, graph: CapturedGraph, args: Sequence[Any]) -> Callable[[], Any]:
    def run() -> Any:
        return spec.replay(graph, args, False)

    return run
