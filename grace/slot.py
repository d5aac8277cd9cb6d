"""One input signature of one compiled callable: its state, its graphs and its stats record.

Problem: a slot goes through warm-up, one deciding call and steady calls, and a steady call may find
its static inputs moved, its outputs still held, a replay failing or differing from the no-graph
callable. Each of those changes what the next call does; that must be visible in one place.

Design: ``GraphSlot.state`` is a ``SlotState`` and ``run`` dispatches on it (the diagram and the
invariants are Note: [Slot states] in grace.runner). The deciding call (grace.decide) returns a frozen
``SlotDecision`` that ``GraphSlot`` applies itself; it writes ``record.variant`` in ``_enter`` only.
A graph variant runs through its ``VariantSpec`` (grace.variants). Graphs made for other static-input
addresses, and further sets of outputs for the same ones (Note: [Output sets]), are kept aside
(``_KeptGraph``) and used again when those addresses come back or those outputs are free; a rebind
(grace.rebind) makes one from the current graph without a deciding call.

Invariants: those of Note: [Slot states] in grace.runner; in particular ``graph`` and ``spec`` are set
whenever the state is ``GRAPH``, the record's variant changes only in ``_enter`` (with the state), and
nothing outside this class writes a slot's state, graph or safety net.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grace import decide as deciding
from grace import outputsets, poolgroups
from grace import stats as grace_stats
from grace.capture import CapturedGraph, HeldState, run_on_side_stream
from grace.compat import torch as torch_compat
from grace.compat.aot import GraphRole
from grace.reasons import SkipCode, SkipReason, log_once
from grace.rebind import moved_static_text
from grace.recent import RecentSlot
from grace.rerun import CallStart, input_versions
from grace.runplan import SlotFacts, SlotOwner
from grace.scg import Decision, Variant, outputs_match
from grace.variants import VariantSpec, spec_of
from grace.verify import check_against_reference, graph_health, synchronize
from grace.warmup import Warmup

logger = logging.getLogger(__name__)


class SlotState(enum.Enum):
    """Where a slot is (Note: [Slot states] in grace.runner)."""

    WARMUP = "warmup"  # warm-up calls left, then the deciding call
    GRAPH = "graph"  # steady: replays ``graph`` through ``spec``
    NO_GRAPH = "no_graph"  # steady: the no-graph callable, the reason in the record
    RELEASED = "released"  # grace.reset or eviction: starts over on its next call


@dataclass
class _KeptGraph:
    """A captured graph set aside while the static inputs sit elsewhere, with its run state."""

    graph: CapturedGraph
    spec: VariantSpec
    verify_calls: int
    verify_ptrs: list[int | None] | None


class GraphSlot:
    """One input signature of one callable: its state, its graph and its stats record."""

    def __init__(self, runner: SlotOwner, signature_text: str) -> None:
        self.runner = runner
        on = str(runner.plan.device) if runner.plan.device else "none"
        self.record = grace_stats.new_record(runner.callable_id, runner.plan.graph_hash, signature_text, on)
        options = runner.options
        self.warmup = Warmup(options.warmup_calls, by_step=runner.plan.step_pool_planned(options))
        self.mutated: set[int] = set(runner.plan.mutated_indices)
        self.state = SlotState.WARMUP
        self.graph: CapturedGraph | None = None
        self.spec: VariantSpec | None = None  # how ``graph`` runs (state GRAPH)
        self.decision: Decision | None = None
        self.noise: dict[str, float] = {}  # Note: [Run-to-run noise] in grace.noise, from the deciding call
        self.signature_text = signature_text
        # Safety net (grace.verify): replays still to compare with the no-graph callable, and the
        # dynamic input addresses of the decision (the first call elsewhere is compared too).
        self.verify_calls = 0
        self.verify_ptrs: list[int | None] | None = None
        # Graphs captured for other static-input addresses (oldest first), bounded by max_recaptures.
        self.kept: list[_KeptGraph] = []
        # grace.rebind: no more graphs sharing outputs (Note: [Layers that hold each other's outputs])
        self.rebind_blocked = False
        self.deciding = False  # inside this slot's deciding call (Note: [One new set per call])
        # The runner's check of this slot's signature (built on its first call; None: no C++ check).
        self.recent: RecentSlot[GraphSlot] | None = None

    def run(self, args: Sequence[Any]) -> Any:
        """One call of the slot, by its state."""
        state = self.state
        if state is SlotState.GRAPH:
            return self._run_graph(args)
        if state is SlotState.NO_GRAPH:
            return self._run_no_graph(args)
        if state is SlotState.WARMUP:
            return self._run_warmup(args)
        return self._run_released(args)

    def facts(self, pool_group: poolgroups.PoolGroup | None = None) -> SlotFacts:
        runner = self.runner
        return SlotFacts(
            compiled=runner.compiled,
            plan=runner.plan,
            options=runner.options,
            record=self.record,
            signature_text=self.signature_text,
            mutated=tuple(sorted(self.mutated)),
            previous=self.decision,
            decision_key=lambda candidates: runner.decision_key(self.signature_text, candidates),
            pool_group=pool_group,
        )

    def _enter(self, state: SlotState, variant: Variant) -> None:
        """The one place the slot's state and its record's variant change together."""
        self.state = state
        self.record.variant = variant

    # --- steady states ---------------------------------------------------------------------

    def _run_no_graph(self, args: Sequence[Any]) -> Any:
        self.record.calls += 1
        return self.runner.run_compiled(args)

    def _run_graph(self, args: Sequence[Any], picked: bool = False) -> Any:
        """One call through the kept graph variant. ``picked``: the set was just found free for this call
        (grace.outputsets: its static inputs, its outputs and the sets tried before it checked)."""
        graph, spec = self.graph, self.spec
        assert graph is not None and spec is not None
        if not picked and graph.static_indices and not graph.static_inputs_unmoved(args):
            return self._static_moved(args)
        if not self.runner.options.clone_outputs:
            generation = torch_compat.compiled_call_generation()
            if not picked:
                held = graph.held_outputs(generation, args)
                earlier = held is not HeldState.HELD and graph.shared_pool is not None  # else: every set
                if earlier and self._swap_in_earlier_set(args, generation):
                    return self._run_graph(args, picked=True)
                if held is not HeldState.NONE:
                    if graph.shares_outputs and self._held_by_family(graph, args, held):
                        return self._leave_family(args)
                    if held is HeldState.HELD:
                        return self._another_output_set(args, generation)
                    return self._run_outputs_held(args)
            graph.note_replay(generation)
        if self.verify_calls or self.verify_ptrs is not None:
            when = self._verification_due(args)
            if when:
                return self._run_verified(args, graph, spec, when)
        self.record.calls += 1
        self.record.graph_calls += 1
        try:
            return spec.replay(graph, args, self.runner.options.clone_outputs)
        except Exception as exc:
            return self.replay_failed(args, exc)

    def _held_by_family(self, graph: CapturedGraph, args: Sequence[Any], held: HeldState) -> bool:
        """Whether outputs that another graph of ``graph``'s family wrote in this call are surely still
        held: counted, or read by this very call (Note: [Layers that hold each other's outputs] in
        grace.rebind)."""
        if not graph.last_replayed_by_another():
            return False
        return held is HeldState.HELD or graph.outputs_read_by(args, self.runner.plan.dynamic_indices)

    def _leave_family(self, args: Sequence[Any]) -> Any:
        """Replace the slot's graph, which shares its outputs with graphs rebound from the same capture,
        by a capture of its own (Note: [Layers that hold each other's outputs] in grace.rebind)."""
        graph = self.graph
        assert graph is not None
        record = self.record
        self.rebind_blocked = True
        reason = SkipReason(
            SkipCode.REBIND_DECLINED,
            "outputs another layer's graph wrote were still held when this layer's graph replayed: "
            "captured with outputs of its own",
        )
        record.add_skip(reason)
        log_once(reason, f"graph {record.graph_id} ({self.signature_text})")
        if graph.origin is not None:  # a rebound graph becomes a captured one: the count of graphs stays
            record.rebinds -= 1
        record.recaptures += 1
        self.graph = None
        graph.release()
        self.note_graphs()
        return self.decide(args)

    def _another_output_set(self, args: Sequence[Any], generation: int) -> Any:
        """Note: [Output sets] in grace.outputsets: replay a free set, or make one, or run without."""
        options = self.runner.options
        if self.deciding:  # Note: [One new set per call] in grace.outputsets: its first replay checked
            self.verify_calls = max(self.verify_calls, int(options.check_numerics))
        group = self.graph.shared_pool if self.graph is not None else None
        free = outputsets.free_set(self.kept, args, generation, group)
        if free is not None:
            self._swap_in(self.kept.pop(free))
            return self._run_graph(args, picked=True)
        candidates = outputsets.same_inputs(self.kept, args)
        training = self.runner.plan.role is not GraphRole.INFERENCE
        outputsets.note_why_taken(self.record, self.kept, candidates, self.graph, generation, args)
        if self.deciding:
            return self._run_outputs_held(args, outputsets.NEW_SET_REFUSED)
        if 1 + len(candidates) >= options.output_sets(training=training):
            return self._run_outputs_held(args)
        group = None  # the step's pool when there is one (``decide``)
        step_pool = self.runner.plan.step_pool(options)
        if training and options.output_sets_share_pool and step_pool is None and self.graph is not None:
            group = self.graph.pool_group_for_sets(self.record)  # Note: [Graphs in one pool]
        self._keep_current()
        return self.decide(args, pool_group=group)

    def _swap_in_earlier_set(self, args: Sequence[Any], generation: int) -> bool:
        """Sets in one pool go earliest first (grace.outputsets): swap in an earlier free one."""
        graph = self.graph
        assert graph is not None
        group = graph.shared_pool
        assert group is not None
        before = group.position(graph.outputs_owner)
        free = outputsets.earlier_free_set(self.kept, args, generation, group, before)
        if free is None:
            return False
        self._swap_in(self.kept.pop(free))
        return True

    def _swap_in(self, kept: _KeptGraph) -> None:
        """Make ``kept`` the slot's graph, the current one kept aside."""
        self._keep_current()
        self.graph, self.spec = kept.graph, kept.spec
        self.verify_calls, self.verify_ptrs = kept.verify_calls, kept.verify_ptrs

    def _run_outputs_held(self, args: Sequence[Any], reason: SkipReason = outputsets.HELD) -> Any:
        """This call without the graph: a replay would overwrite outputs of the graph's previous replay
        that may still be held, in the same compiled call (Note: [Outputs held within one call] in
        grace.outputs) or by another thread (Note: [Outputs and threads] in grace.outputs), or ``reason``.
        """
        record = self.record
        record.calls += 1
        record.held_output_calls += 1
        if reason not in record.skip_reasons:
            record.add_skip(reason)
            log_once(reason, f"graph {record.graph_id} ({self.signature_text})")
        return self.runner.run_compiled(args)

    # --- safety net (grace.verify) ----------------------------------------------------------

    def arm_verification(self, args: Sequence[Any], calls: int = 2) -> None:
        """Compare the next ``calls`` replays and the first one at other input addresses with eager."""
        if not self.runner.options.check_numerics:
            return
        self.verify_calls = calls
        ptrs: list[int | None] = [None] * len(args)
        for i in self.runner.plan.dynamic_indices:
            ptrs[i] = args[i].data_ptr()
        self.verify_ptrs = ptrs

    def inputs_moved(self, args: Sequence[Any]) -> bool:
        ptrs = self.verify_ptrs
        if ptrs is None or len(ptrs) != len(args):
            return ptrs is not None
        return not torch_compat.data_ptrs_equal(args, ptrs, self.runner.plan.dynamic_indices)

    def _verification_due(self, args: Sequence[Any]) -> str:
        if self.inputs_moved(args):
            return "first call with inputs at new addresses"
        if self.verify_calls:
            return "first replays after the decision"
        return ""

    def _run_verified(self, args: Sequence[Any], graph: CapturedGraph, spec: VariantSpec, when: str) -> Any:
        if self.inputs_moved(args):
            self.verify_ptrs = None  # the move check is done for this graph
        self.verify_calls = max(0, self.verify_calls - 1)
        variant = self.record.variant
        self.record.calls += 1
        self.record.graph_calls += 1
        clone = self.runner.options.clone_outputs
        try:
            out, problem, reference = check_against_reference(
                lambda: spec.replay(graph, args, clone),
                self.runner.compiled,
                args,
                sorted(self.mutated),
                graph,
                self.runner.plan.device,
                self.runner.options.host_reference_bytes,
                random=bool(self.runner.plan.random_ops),
                noise=self.noise,
                undefined=self.runner.plan.undefined_outputs,
            )
        except Exception as exc:
            self.record.calls -= 1
            self.record.graph_calls -= 1
            return self.replay_failed(args, exc)
        if problem is None:
            return out
        self.drop_for_mismatch(variant, when, problem)
        return reference

    def drop_for_mismatch(self, variant: Any, when: str, problem: str) -> None:
        """No graph from now on: ``variant`` differed from the no-graph output at ``when``."""
        text = f"{getattr(variant, 'value', variant)} at the {when}: {problem}"
        self.set_no_graph(SkipReason(SkipCode.NUMERIC_MISMATCH, text))

    # --- transitions -----------------------------------------------------------------------

    def _run_warmup(self, args: Sequence[Any]) -> Any:
        if self.warmup.decides_now():  # Note: [Captures of a step in one step] in grace.warmup
            return self.decide(args)
        self.record.calls += 1
        before = input_versions(args)
        device = self.runner.plan.device
        assert device is not None
        out = run_on_side_stream(self.runner.compiled, args, device)
        after = input_versions(args)
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            if b is not None and a is not None and a != b:
                self.mutated.add(i)
        return out

    def set_no_graph(self, reason: SkipReason | None) -> None:
        if reason is not None:
            self.record.add_skip(reason)
            log_once(reason, f"graph {self.record.graph_id} ({self.signature_text})")
        self.verify_calls = 0
        self.verify_ptrs = None
        self.release_graph()
        self._enter(SlotState.NO_GRAPH, Variant.NO_GRAPH)

    def release_graph(self) -> None:
        if self.graph is not None:
            self.graph.release()
            self.graph = None
        self.spec = None
        for kept in self.kept:
            kept.graph.release()
        self.kept = []
        self.note_graphs()

    def note_graphs(self) -> None:
        """Record the graphs the slot keeps and the bytes their outputs hold."""
        graphs = [k.graph for k in self.kept] + ([self.graph] if self.graph is not None else [])
        self.record.graphs_held = len(graphs)
        self.record.output_bytes_held = sum(g.output_bytes for g in graphs)

    def _keep_current(self) -> None:
        if self.graph is not None:
            assert self.spec is not None
            self.kept.append(_KeptGraph(self.graph, self.spec, self.verify_calls, self.verify_ptrs))
            self.graph = None

    def _kept_for(self, args: Sequence[Any]) -> _KeptGraph | None:
        for i in range(len(self.kept) - 1, -1, -1):
            if self.kept[i].graph.static_inputs_unmoved(args):
                return self.kept.pop(i)
        return None

    def release(self) -> None:
        self.release_graph()
        self.record.released = True
        self.state = SlotState.RELEASED

    def _run_released(self, args: Sequence[Any]) -> Any:
        # A released slot (grace.reset) starts over as a fresh one on its next call.
        self.record.released = False
        self.warmup = Warmup(self.runner.options.warmup_calls, by_step=self.warmup.by_step)
        self.state = SlotState.WARMUP
        return self.run(args)

    def replay_failed(self, args: Sequence[Any], exc: Exception) -> Any:
        self.set_no_graph(SkipReason(SkipCode.REPLAY_FAILED, f"{type(exc).__name__}: {exc}"))
        return self._run_no_graph(args)

    def _static_moved(self, args: Sequence[Any]) -> Any:
        kept = self._kept_for(args)
        if kept is not None:  # a graph captured for these very addresses: use it again
            self._swap_in(kept)
            return self.run(args)
        record = self.record
        options = self.runner.options
        rebound = self._rebind(args) if record.rebinds < options.max_rebinds else None
        if rebound is not None:  # same variant, same pool and outputs: no capture, no decision
            self._keep_current()
            self.graph = rebound
            record.rebinds += 1
            self.note_graphs()
            self.arm_verification(args)
            return self.run(args)
        if record.recaptures + 1 > options.max_recaptures:
            self.set_no_graph(
                SkipReason(
                    SkipCode.TOO_MANY_RECAPTURES,
                    f"static inputs (parameters/buffers) moved {record.recaptures + 1} times where no "
                    f"graph could be rebound ({record.rebinds} rebound)",
                )
            )
            return self._run_no_graph(args)
        record.recaptures += 1
        record.add_skip(
            SkipReason(
                SkipCode.STATIC_INPUT_MOVED,
                f"re-captured after a parameter moved ({moved_static_text(self.graph, args)})",
            )
        )
        self._keep_current()
        return self.decide(args)

    def _rebind(self, args: Sequence[Any]) -> CapturedGraph | None:
        if not self.runner.options.rebind or self.graph is None or self.rebind_blocked:
            return None
        with self.runner.lock:
            rebound = deciding.rebind_graph(self.facts(), self.graph, self.record.variant, args)
        if rebound.block:
            self.rebind_blocked = True
        return rebound.graph

    # --- the deciding call -----------------------------------------------------------------

    def decide(self, args: Sequence[Any], pool_group: poolgroups.PoolGroup | None = None) -> Any:
        """A deciding call; its captures go into ``pool_group``'s pool, or the step's (``step_pool``)."""
        runner, args = self.runner, tuple(args)  # grace.boxing: no run of a deciding call takes the inputs
        with runner.lock:
            outer, self.deciding = self.deciding, True
            try:
                wanted = pool_group or runner.plan.step_pool(runner.options)
                group = poolgroups.for_capture(wanted, self.record)
                out = self.apply(deciding.decide(self.facts(group), args), args)
                for graph in [self.graph, *(k.graph for k in self.kept)] if group is not None else []:
                    poolgroups.lend_outputs(graph)  # Note: [Outputs a shared pool lends] in grace.outputs
                return out
            finally:
                self.deciding = outer

    def apply(self, decision: deciding.SlotDecision, args: Sequence[Any]) -> Any:
        """Enter the state ``decision`` settles and finish the deciding call with it."""
        record = self.record
        if decision.variant == Variant.PENDING:  # a write the analysis missed: decide again next call
            self.mutated.update(decision.written)
            record.calls += 1
            self.warmup.finish()
            self.state = SlotState.WARMUP  # also after a capture for moved static inputs: no graph bound
            return decision.output
        if decision.decision is not None:
            record.decision = decision.decision
            self.decision = decision.decision
        self.noise = dict(decision.noise)
        start = decision.start
        if decision.graph is None:
            self.set_no_graph(decision.reason)
            if (decision.output is not None or decision.ran) and start is not None:  # the call's output
                record.calls += 1
                start.resume_first_run()  # the generators where the run that made it left them
                return decision.output
            if start is not None:
                start.restore()
            return self._run_no_graph(args)
        self.bind(decision.variant, decision.graph)
        if not decision.verify:
            return self.run(args)
        assert start is not None
        if decision.host_reference is None:
            self.arm_verification(args)  # this call's replay, the first steady one, the first elsewhere
            start.restore()
            return self.run(args)
        # This call's replay is compared with the host reference (same inputs, no side effects) and the
        # first call at new addresses with the no-graph callable; no no-graph run while the graph lives.
        self.arm_verification(args, calls=0)
        return self._returned_replay(args, decision.host_reference, start)

    def bind(self, variant: Variant, graph: CapturedGraph) -> None:
        """Enter state ``GRAPH`` with ``graph`` run as ``variant`` (its spec in grace.variants)."""
        spec = spec_of(variant)
        self.graph, self.spec = graph, spec
        spec.settle(graph)
        self.note_graphs()
        self._enter(SlotState.GRAPH, variant)
        self.record.copy_bytes_per_replay = spec.copied_bytes(graph)
        self.record.copy_launches_per_replay = spec.copy_launches(graph)

    def _returned_replay(self, args: Sequence[Any], host_reference: Any, start: CallStart) -> Any:
        """The deciding call's replay, compared with the reference held in host memory; the no-graph
        callable's output instead (and no graph from now on) when they differ. Each run starts from the
        call's state (``start``)."""
        graph = self.graph
        start.restore()
        out = self.run(args)
        if self.graph is not graph or graph is None or not self.runner.options.check_numerics:
            return out  # (a failed replay already left the slot without a graph)
        synchronize(graph.device)
        undefined = self.runner.plan.undefined_outputs
        problem = outputs_match(host_reference, out, noise=self.noise, undefined=undefined)
        problem = problem or graph_health(graph)
        if problem is None:
            return out
        self.drop_for_mismatch(self.record.variant, "deciding call's replay", problem)
        start.restore()
        return self.runner.compiled(*args)
