"""The graph variants a slot can run, one spec each: how to capture it, run it, count its copies.

Problem: a graph variant (with input copies, with parameter indirection) used to be spelled out in
about ten places: the capture order and the check order of the deciding call, the preference when
nothing is timed, the replay a steady call makes, the bytes and launches a replay copies, the hooks of
a rebind. Adding a variant meant finding them all.

Design: one ``VariantSpec`` subclass per graph variant, registered by its ``Variant`` in
``REGISTRY`` (registration order is the capture order, itself part of the persisted decision key).
A spec says whether the slot wants it (recording why not), captures it (given the graphs captured
before it, or alone on the caller's inputs), replays it, prepares its numeric check, tells whether it
must also be checked at new input addresses, counts what a replay copies, and rebinds it for moved
static inputs. The deciding call (grace.decide) and the slot (grace.slot) only iterate over specs.
``Variant.NO_GRAPH`` is no spec: it is the reference every graph variant is compared with.

Invariants:
- a spec never writes a slot: it returns graphs (or None with the reason in the stats record);
- a graph a spec returns is ready to replay (PI: its plan adopted and its first launch prepared);
- a spec that ``needs`` another variant is captured only when that one was (PI reads the copies
  graph's placeholders, Note: [Deciding-call memory] in docs/design/runtime.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

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
from grace.reasons import SkipCode, SkipReason, log_once
from grace.runplan import SlotFacts
from grace.scg import Variant
from grace.stats import GraphStats

logger = logging.getLogger(__name__)


class VariantSpec:
    """One graph variant; subclasses set the class attributes and override what differs."""

    variant: ClassVar[Variant]
    check_rank: ClassVar[int] = 0  # numeric checks run in increasing rank
    preference: ClassVar[int] = 0  # kept in increasing preference when nothing is timed
    needs: ClassVar[tuple[Variant, ...]] = ()  # variants that must be captured before this one

    def wanted(self, facts: SlotFacts) -> bool:
        """Whether to capture this variant for the slot; records why not where it was asked for."""
        return True

    def capture_alone(self, facts: SlotFacts, args: Sequence[Any]) -> CapturedGraph | None:
        """A graph of this variant that stands alone, captured before any other (None: capture the
        usual set)."""
        return None

    def capture(
        self, facts: SlotFacts, args: Sequence[Any], before: Mapping[Variant, CapturedGraph]
    ) -> CapturedGraph | None:
        raise NotImplementedError

    def replay(self, graph: CapturedGraph, args: Sequence[Any], clone: bool) -> Any:
        raise NotImplementedError

    def prepare_check(self, graph: CapturedGraph) -> None:
        """Called before the variant's numeric check of the deciding call."""

    def checks_new_addresses(self, graph: CapturedGraph, mutates: bool) -> bool:
        """Whether the deciding call also runs the graph with its inputs at other addresses."""
        return False

    def settle(self, graph: CapturedGraph) -> None:
        """What the slot's graph of this variant lets go once it is bound (nothing by default)."""

    def copied_bytes(self, graph: CapturedGraph) -> int:
        return graph.copy_bytes

    def copy_launches(self, graph: CapturedGraph) -> int:
        return _launches(graph, graph.copy_indices)

    def rebind(self, facts: SlotFacts, origin: CapturedGraph, args: Sequence[Any]) -> CapturedGraph | None:
        """A graph of this variant rebound from ``origin`` for the static inputs of ``args``; raises
        ``CaptureError`` when grace.rebind declines, None when the variant declines (reason recorded)."""
        from grace.rebind import rebind

        return rebind(origin, args, [], facts.plan.random_ops)


def _launches(graph: CapturedGraph, indices: Sequence[int]) -> int:
    copies = 1 if len(indices) > 1 and hasattr(torch, "_foreach_copy_") else len(indices)
    return copies + len([i for i in graph.mutated_indices if i in indices])


def _capture(facts: SlotFacts, args: Sequence[Any], hooks: Sequence[Any], **kwargs: Any) -> CapturedGraph:
    plan = facts.plan
    return capture_graph(
        facts.compiled,
        args,
        device=facts.device,
        dynamic_indices=plan.dynamic_indices,
        static_indices=plan.static_indices,
        mutated_indices=list(facts.mutated),
        hooks=hooks,
        keep_pristine=facts.keeps_pristine,
        kept_from=plan.kept_from,
        pool_group=facts.pool_group,
        pool_kin=facts.record,
        **kwargs,
    )


class CopiesSpec(VariantSpec):
    """The graph with input copies: what PyTorch2-CG does on each call."""

    variant = Variant.GRAPH_COPIES
    check_rank = 1
    preference = 1

    def capture(
        self, facts: SlotFacts, args: Sequence[Any], before: Mapping[Variant, CapturedGraph]
    ) -> CapturedGraph | None:
        sink: dict[str, Any] = {}
        try:
            graph = _capture(facts, args, [summary_hook(sink)])
        except CaptureError as exc:
            facts.record.add_skip(exc.reason)
            _log(facts, exc)
            return None
        record_summary(facts.record, sink)
        return graph

    def replay(self, graph: CapturedGraph, args: Sequence[Any], clone: bool) -> Any:
        return graph.run_with_copies(args, clone)


class PISpec(VariantSpec):
    """The graph with parameter indirection: a pointer table points its reads at the real inputs."""

    variant = Variant.GRAPH_PI
    check_rank = 0  # first: the placeholders it shares with the copies graph hold no copied input yet
    preference = 0
    needs = (Variant.GRAPH_COPIES,)

    def wanted(self, facts: SlotFacts) -> bool:
        plan = facts.plan
        if not facts.options.pi:
            return False
        if plan.pi_prepare is None:
            if plan.pi_unavailable is not None:
                facts.record.add_skip(plan.pi_unavailable)
            return False
        if not plan.dynamic_indices:
            facts.record.add_skip(SkipReason(SkipCode.PI_NO_DYNAMIC_INPUTS, "every tensor input is static"))
            return False
        return True

    def capture_alone(self, facts: SlotFacts, args: Sequence[Any]) -> CapturedGraph | None:
        """Note: [A PI graph alone]
        Under option ``pi_direct`` the PI graph is first captured on the caller's inputs, reading in
        place every input it can: of inputs sharing one storage only the first (the others, and an
        input sharing a static input's storage, get placeholders of their own: PI tells uses apart by
        storage, ``grace.capture.own_placeholder_inputs``). Where the inputs cannot be borrowed at all
        (an output views one: the caller's tensor would be an output), it is captured alone on
        placeholders of its own: checked like any PI graph (zeros in the placeholders, then the
        placeholders as inputs at new addresses) and, when it fails, followed by the graph with copies.
        So a deciding call holds one graph's outputs instead of two (a training forward's saved
        tensors), and placeholders only where they are needed (a training backward's saved tensors,
        two of which may view one tensor). A graph whose plan leaves an input to a copy is released:
        the usual pair follows, the graph with copies first and the PI graph on its placeholders."""
        if not facts.options.pi_direct:
            return None
        declined: list[SkipReason] = []
        graph = self._capture(facts, args, borrow=True, declined=declined)
        if graph is not None or not any(r.code is SkipCode.PI_DIRECT_DECLINED for r in declined):
            return graph
        graph = self._capture(facts, args)
        if graph is not None and graph.pi_plan is not None and graph.pi_plan.uncovered_indices:
            graph.release()
            return None
        return graph

    def capture(
        self, facts: SlotFacts, args: Sequence[Any], before: Mapping[Variant, CapturedGraph]
    ) -> CapturedGraph | None:
        return self._capture(facts, args, shared=before[Variant.GRAPH_COPIES].placeholders)

    def _capture(
        self,
        facts: SlotFacts,
        args: Sequence[Any],
        *,
        borrow: bool = False,
        shared: Mapping[int, Any] | None = None,
        declined: list[SkipReason] | None = None,
    ) -> CapturedGraph | None:
        """The PI graph, read from ``shared`` placeholders, from placeholders of its own, or (``borrow``)
        from the caller's inputs; None with the reason recorded when PI cannot serve it (a borrowed
        capture also when one input keeps a copy, and ``declined`` gets the capture's own refusal). A
        graph captured without another (not on ``shared`` placeholders) records the graph's summary."""
        holder: dict[str, Any] = {}
        sink: dict[str, Any] = {}
        hook = pi_hook(facts, args, holder)
        alone = shared is None
        try:
            graph = _capture(
                facts,
                args,
                [summary_hook(sink), hook] if alone else [hook],
                placeholders=shared,
                borrow_inputs=borrow,
            )
        except CaptureError as exc:
            if declined is not None:
                declined.append(exc.reason)  # why the capture itself refused (capture_alone reads it)
            code, what = (
                (SkipCode.PI_DIRECT_DECLINED, "capture") if borrow else (SkipCode.PI_FAILED, "capture for PI")
            )
            facts.record.add_skip(SkipReason(code, f"{what}: {exc.reason}"))
            return None
        if not adopt_pi(facts.record, graph, holder.get("result"), borrow):
            return None
        if alone:
            record_summary(facts.record, sink)
        return graph

    def replay(self, graph: CapturedGraph, args: Sequence[Any], clone: bool) -> Any:
        return graph.run_with_pi(args, clone)

    def prepare_check(self, graph: CapturedGraph) -> None:
        # A PI slot stuck at its capture address reads a placeholder; if that memory happens to hold the
        # inputs' values (reused from them, or copied by the copies graph) it would pass. Zeros fail it.
        poison_placeholders(graph.placeholders)

    def checks_new_addresses(self, graph: CapturedGraph, mutates: bool) -> bool:
        # A graph captured on the caller's inputs has no placeholders to move to: its first call at other
        # addresses is compared with the no-graph callable by the slot (grace.verify).
        return not mutates and not graph.borrowed

    def settle(self, graph: CapturedGraph) -> None:
        """Note: [Placeholders PI serves]
        A PI graph captured with placeholders (the copies graph's, shared in the deciding call) keeps
        them only for the inputs its table cannot point elsewhere. No node of the graph reads the
        placeholder of an input the plan serves: each replay reads the caller's tensor through the
        table. So once bound the graph drops the placeholders of every input its plan's last update
        served, keeping their layouts, and for those inputs is from then on what a graph captured on
        the caller's inputs is (``CapturedGraph.borrowed``); the inputs the plan does not serve keep
        theirs and are copied into them on every call. A call that leaves an input without a
        placeholder unserved (a misaligned address) first gives the graph placeholders of its own and
        points the plan at them (``CapturedGraph.run_with_pi``). This matters where the dynamic inputs
        are large: a training backward's are the saved tensors, whose placeholders doubled what its
        step kept allocated, and one small input the table cannot serve (a mask a vendor kernel reads)
        had kept all of them. A graph that writes an input keeps every placeholder (the deciding call's
        restores and the copy back read them). Invariant: a graph never replays reading a placeholder
        it dropped, since it drops only those of inputs its plan's last update served, and any later
        update that leaves one of them unserved gives it a new one before the replay."""
        plan = graph.pi_plan
        if plan is None or graph.mutated_indices:
            return
        graph.forget_placeholders(keep=frozenset(plan.uncovered_indices))

    def _uncovered(self, graph: CapturedGraph) -> list[int] | None:
        if graph.pi_plan is None:
            return None
        uncovered = set(graph.pi_plan.uncovered_indices)
        return [i for i in graph.copy_indices if i in uncovered]

    def copied_bytes(self, graph: CapturedGraph) -> int:
        indices = self._uncovered(graph)
        if indices is None:
            return graph.copy_bytes
        return sum(dense_view(graph.placeholders[i]).nbytes for i in indices)

    def copy_launches(self, graph: CapturedGraph) -> int:
        indices = self._uncovered(graph)
        return _launches(graph, graph.copy_indices if indices is None else indices)

    def rebind(self, facts: SlotFacts, origin: CapturedGraph, args: Sequence[Any]) -> CapturedGraph | None:
        from grace.rebind import rebind

        holder: dict[str, Any] = {}
        hooks = [pi_hook(facts, args, holder, dict(origin.capture_spans))]
        graph = rebind(origin, args, hooks, facts.plan.random_ops)
        if not adopt_pi(facts.record, graph, holder.get("result"), graph.borrowed):
            return None
        return graph


def _log(facts: SlotFacts, exc: CaptureError) -> None:
    log_once(exc.reason, f"graph {facts.record.graph_id} ({facts.signature_text})")


# --- parameter indirection: the hook that prepares a plan, and adopting the plan -------------------


def record_summary(record: GraphStats, sink: dict[str, Any]) -> None:
    summary = sink.get("summary")
    if summary is not None:
        record.kernel_nodes = summary.kernel_nodes
        record.launch_nodes = sum(summary.by_type.get(t, 0) for t in ("kernel", "memset", "memcpy"))
        record.node_types = dict(summary.by_type)
    elif "summary_error" in sink:
        logger.debug("grace: no node counts for %s: %s", record.graph_id, sink["summary_error"])


def pi_hook(
    facts: SlotFacts, args: Sequence[Any], holder: dict[str, Any], spans: dict[int, StorageSpan] | None = None
) -> GraphHook:
    """A capture hook that prepares PI for the graph and leaves the plan (or a ``SkipReason``) in
    ``holder["result"]``; ``spans``: where the graph reads its dynamic inputs, when not the placeholders."""
    plan = facts.plan
    device = facts.device
    prepare = plan.pi_prepare
    assert prepare is not None

    def hook(handle: int, placeholders: Any) -> None:
        ctx = CaptureContext(
            graph_handle=handle,
            placeholders=dict(placeholders),
            dynamic_input_indices=plan.dynamic_indices,
            compiled=facts.compiled,
            output_codes=plan.output_codes,
            device=device,
            example_inputs=tuple(args),
            pi_table_update=facts.options.pi_table_update,
            pi_vendor_update=facts.options.pi_vendor_update,
            placeholder_spans=spans,
        )
        try:
            holder["result"] = prepare(ctx)
        except Exception as exc:  # a PI failure must only cost PI
            holder["result"] = SkipReason(SkipCode.PI_FAILED, f"prepare raised {type(exc).__name__}: {exc}")

    return hook


def adopt_pi(record: GraphStats, pi_graph: CapturedGraph, result: Any, borrow: bool) -> bool:
    """Give ``pi_graph`` the plan its hook prepared and ready its first launch; False (the graph
    released, the reason recorded) when PI cannot serve it, or a graph read on the caller's inputs
    would keep a copy of one."""
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
    uncovered = tuple(result.uncovered_indices)
    if borrow and uncovered:
        # Such an input is read at its capture address: the caller's tensor, which must never be
        # copied into. Capture again with placeholders.
        why = "; ".join(f"input {i}: {r}" for i, r in sorted(result.uncovered_reasons.items()))
        record.add_skip(
            SkipReason(SkipCode.PI_DIRECT_DECLINED, f"inputs {list(uncovered)} keep a copy ({why})")
        )
        pi_graph.pi_plan = result
        pi_graph.release()  # with its plan (the table, a fill node's module)
        return False
    pi_graph.pi_plan = result
    if not _prepare_first_launch(record, pi_graph, result):
        return False
    record.pi_bytes_per_replay = int(result.bytes_per_replay)
    record.pi_stages = [tuple(s) for s in result.stages]  # type: ignore[misc]
    return True


def _prepare_first_launch(record: GraphStats, pi_graph: CapturedGraph, result: Any) -> bool:
    """Hand the instantiated graph to the plan's ``prepare_launch`` (a graph with vendor nodes is
    uploaded: CUDA asks for that before device-side node updates); False, released, when it fails."""
    if not result.launch_preparation_needed:
        return True
    try:
        stream = torch.cuda.current_stream(pi_graph.device)
        result.prepare_launch(torch_compat.graph_exec_handle(pi_graph.graph), int(stream.cuda_stream))
        stream.synchronize()
    except Exception as exc:
        record.add_skip(
            SkipReason(SkipCode.PI_FAILED, f"preparing the first launch: {type(exc).__name__}: {exc}")
        )
        pi_graph.release()
        return False
    return True


REGISTRY: dict[Variant, VariantSpec] = {}


def register(spec: VariantSpec) -> None:
    """Add ``spec`` to the variants every slot considers (after those registered before it)."""
    REGISTRY[spec.variant] = spec


def unregister(variant: Variant) -> None:
    REGISTRY.pop(variant, None)


def spec_of(variant: Variant) -> VariantSpec:
    return REGISTRY[variant]


def specs() -> list[VariantSpec]:
    """The registered specs in capture order."""
    return list(REGISTRY.values())


register(CopiesSpec())
register(PISpec())
