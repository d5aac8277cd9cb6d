"""The graph runner: what ``torch.compile(backend="grace")`` returns to Dynamo for one FX graph.

Problem: one compiled callable is called with many inputs. Each input signature (shapes, strides,
dtypes of the dynamic tensors, values of integer inputs) needs its own CUDA graph, graphs must be
bounded in number, and for each of them one of three variants runs: no graph, graph with input copies,
graph with parameter indirection (PI). Nothing may produce a wrong result: not a new shape, not an
input at a new address, not a parameter that moved, not a failed capture.

Design: ``GraceRunner`` keys ``GraphSlot`` objects by signature in an LRU ``OrderedDict``. Building the
signature costs Python work per input on every call; a call that matches the last call's slot under a
C++ tensor check (Dynamo's ``TensorGuards``, stricter than the signature) skips it. A slot goes
through warm-up calls (run without a graph on grace's capture stream; input mutations detected by
version counters, added to those the FX graph shows), then one deciding call (capture the variants,
check each against the no-graph output on the caller's inputs, time them unless a persisted decision
exists, keep one, release the others), then steady calls through one bound function per variant. Any
failure turns the slot into a no-graph slot with the reason recorded in its ``GraphStats``. Safety net
(grace.verify): the deciding call's returned replay, the first steady call and the first call whose
dynamic inputs sit at new addresses are compared with the no-graph callable once per graph; a mismatch
returns the no-graph output and falls back with ``numeric_mismatch``.

Static inputs that move: when a replay finds the static inputs (parameters, buffers) at other
addresses, the slot keeps its graph aside and makes one for the new addresses: rebound from a copy of
the captured graph (grace.rebind: same variant, same pool and outputs, no deciding call; its first
replays are verified), or, where that is declined, captured again; when a later call brings back a set
of addresses a kept graph was made for, that graph is used again. This serves one compiled callable
shared by several modules of one class (a layer body that Dynamo compiled once after a graph break,
called for every layer with that layer's parameters), as cudagraph trees re-record. A rebound graph
that finds outputs another layer's graph wrote still held is replaced by a capture of its own (Note:
[Layers that hold each other's outputs] in grace.rebind). Captures for moved static inputs are bounded
by ``max_recaptures`` and rebound graphs by ``max_rebinds``; a move past both bounds leaves the slot
without a graph, and every graph it kept is released.

Threads and streams: one lock per compiled callable (``GraceRunner.lock``) is held for each call from
the input check to the hand-out of the outputs, deciding calls, warm-up and checks included, so the
host side of two calls never overlaps: no two calls copy into the same placeholders, write one pointer
table or collect one set of outputs at once. Outputs another thread received are never overwritten while
held (Note: [Outputs and threads] in grace.capture), a run on another stream waits for the stream of the
graph's previous run (Note: [Stream order]), and a released graph's pool lives while its outputs are held
(grace.pools; the runner releases waiting pools at the start of each call). A thread whose first CUDA
work is a call of a compiled callable gets the device's primary context made current first
(``grace.compat.cuda.ensure_context_current``): the driver calls of a replay need one.

Invariants:
- at most one call of a compiled callable runs its runner's code at a time, whatever the threads;
- a graph's copies, table update and replay are queued after all work queued so far on the stream of
  the graph's (or its family's) previous run;
- a slot's graph is used only for inputs with its signature and while its static inputs have the
  addresses they had at capture (checked on every replay; a kept graph only when all of them match);
- a graph that mutates an input is never run more often than the caller calls it, unless every
  extra run (the deciding call's reference and checks, the verified replays of later calls and their
  no-graph reference; SCG does not time such a graph) starts from a restored snapshot of every input
  it may write (grace.rerun); the inputs it may write come from the op schemas (grace.analysis), so
  the rule holds without warm-up calls and under ``inference_mode`` (no version counters). A callable
  that draws random numbers leaves the generators where one run leaves them, every extra run starting
  from their states at the call's start;
- the runner returns exactly the structure the compiled callable returns.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grace import pools
from grace import stats as grace_stats
from grace.adapting import InputAdapting
from grace.capture import HELD, CaptureContext, CapturedGraph, calling_threads, run_on_side_stream
from grace.compat import cuda as cuda_compat
from grace.compat import torch as torch_compat
from grace.options import GraceOptions
from grace.picking import Picker, picker
from grace.reasons import SkipCode, SkipReason, log_once
from grace.scg import Decision, DecisionKey, Variant

logger = logging.getLogger(__name__)

PIPrepare = Callable[[CaptureContext], Any]  # returns a PIPlan or a SkipReason


@dataclass(frozen=True)
class RunnerPlan:
    """What the backend learned about one compiled callable's inputs."""

    graph_hash: str
    device: torch.device | None
    static_indices: tuple[int, ...]
    dynamic_indices: tuple[int, ...]
    scalar_indices: tuple[int, ...]
    mutated_indices: tuple[int, ...] = ()
    skip: SkipReason | None = None
    output_codes: tuple[Any, ...] = ()
    input_adapter: InputAdapting | None = None
    pi_prepare: PIPrepare | None = None
    pi_unavailable: SkipReason | None = None
    random_ops: tuple[str, ...] = ()  # operators that draw random numbers (grace.rebind declines them)


@dataclass(frozen=True)
class Environment:
    """The parts of a decision key that do not depend on the graph."""

    gpu: str
    driver: str
    cuda_runtime: str
    torch: str
    triton: str


def _versions_of(args: Sequence[Any]) -> list[int | None]:
    out: list[int | None] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            try:
                out.append(a._version)
            except RuntimeError:  # inference tensors track no version
                out.append(None)
        else:
            out.append(None)
    return out


@dataclass
class _KeptGraph:
    """A captured graph set aside while the static inputs sit elsewhere, with its run state."""

    graph: CapturedGraph
    run: Callable[[Sequence[Any]], Any]
    verify_calls: int
    verify_ptrs: list[int | None] | None


class GraphSlot:
    """One input signature of one callable: its state, its graph and its stats record."""

    def __init__(self, runner: GraceRunner, signature_text: str) -> None:
        self.runner = runner
        device = runner.plan.device
        self.record = grace_stats.new_record(
            runner.callable_id, runner.plan.graph_hash, signature_text, str(device) if device else "none"
        )
        self.warmups_left = runner.options.warmup_calls
        self.mutated: set[int] = set(runner.plan.mutated_indices)
        self.graph: CapturedGraph | None = None
        self.decision: Decision | None = None
        self.run: Callable[[Sequence[Any]], Any] = self._run_warmup
        self.signature_text = signature_text
        # Safety net (grace.verify): replays still to compare with the no-graph callable, and the
        # dynamic input addresses of the decision (the first call elsewhere is compared too).
        self.verify_calls = 0
        self.verify_ptrs: list[int | None] | None = None
        # Graphs captured for other static-input addresses (oldest first), bounded by max_recaptures.
        self.kept: list[_KeptGraph] = []
        # grace.rebind: no more graphs sharing outputs for this slot (Note: [Layers that hold each
        # other's outputs]).
        self.rebind_blocked = False
        # The runner's check that a call has this slot's signature (built on the slot's first call;
        # stays None where this torch has no C++ tensor check).
        self.recent: _RecentSlot | None = None

    # --- steady states ---------------------------------------------------------------------

    def _run_no_graph(self, args: Sequence[Any]) -> Any:
        self.record.calls += 1
        return self.runner.compiled(*args)

    def _run_copies(self, args: Sequence[Any]) -> Any:
        assert self.graph is not None
        return self._run_graph(args, self.graph.run_with_copies)

    def _run_pi(self, args: Sequence[Any]) -> Any:
        assert self.graph is not None
        return self._run_graph(args, self.graph.run_with_pi)

    def _run_graph(self, args: Sequence[Any], replay: Callable[[Sequence[Any], bool], Any]) -> Any:
        """One call through the kept graph variant (``replay``: with copies or with PI)."""
        graph = self.graph
        assert graph is not None
        if graph.static_indices and not graph.static_inputs_unmoved(args):
            return self._static_moved(args)
        if not self.runner.options.clone_outputs:
            generation = torch_compat.compiled_call_generation()
            held = graph.held_outputs(generation)
            if held:
                if graph.shares_outputs and self._held_by_family(graph, args, held):
                    return self._leave_family(args)
                return self._run_outputs_held(args)
            graph.note_replay(generation)
        if self.verify_calls or self.verify_ptrs is not None:
            when = self._verification_due(args)
            if when:
                return self._run_verified(args, replay, when)
        self.record.calls += 1
        self.record.graph_calls += 1
        try:
            return replay(args, self.runner.options.clone_outputs)
        except Exception as exc:
            return self._replay_failed(args, exc)

    def _held_by_family(self, graph: CapturedGraph, args: Sequence[Any], held: str) -> bool:
        """Whether outputs that another graph of ``graph``'s family wrote in this call are surely still
        held: counted, or read by this very call (Note: [Layers that hold each other's outputs])."""
        if not graph.last_replayed_by_another():
            return False
        return held == HELD or graph.outputs_read_by(args, self.runner.plan.dynamic_indices)

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
        return self._decide(args)

    def _run_outputs_held(self, args: Sequence[Any]) -> Any:
        """This call without the graph: a replay would overwrite outputs of the graph's previous replay
        that may still be held, in the same compiled call (Note: [Outputs held within one call]) or by
        another thread (Note: [Outputs and threads])."""
        record = self.record
        record.calls += 1
        record.held_output_calls += 1
        if record.held_output_calls == 1:
            reason = SkipReason(
                SkipCode.OUTPUTS_HELD,
                "the graph runs again while outputs of its previous replay may be held (within one "
                "compiled call, or by a call from another thread); such calls run without the graph",
            )
            record.add_skip(reason)
            log_once(reason, f"graph {record.graph_id} ({self.signature_text})")
        return self.runner.compiled(*args)

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

    def _inputs_moved(self, args: Sequence[Any]) -> bool:
        ptrs = self.verify_ptrs
        if ptrs is None or len(ptrs) != len(args):
            return ptrs is not None
        return not torch_compat.data_ptrs_equal(args, ptrs, self.runner.plan.dynamic_indices)

    def _verification_due(self, args: Sequence[Any]) -> str:
        if self._inputs_moved(args):
            return "first call with inputs at new addresses"
        if self.verify_calls:
            return "first replays after the decision"
        return ""

    def _run_verified(self, args: Sequence[Any], run: Callable[[Sequence[Any], bool], Any], when: str) -> Any:
        from grace.verify import check_against_reference

        if self._inputs_moved(args):
            self.verify_ptrs = None  # the move check is done for this graph
        self.verify_calls = max(0, self.verify_calls - 1)
        graph = self.graph
        variant = self.record.variant
        self.record.calls += 1
        self.record.graph_calls += 1
        clone = self.runner.options.clone_outputs
        try:
            out, problem, reference = check_against_reference(
                lambda: run(args, clone),
                self.runner.compiled,
                args,
                sorted(self.mutated),
                graph,
                self.runner.plan.device,
                self.runner.options.host_reference_bytes,
                random=bool(self.runner.plan.random_ops),
            )
        except Exception as exc:
            self.record.calls -= 1
            self.record.graph_calls -= 1
            return self._replay_failed(args, exc)
        if problem is None:
            return out
        self.drop_for_mismatch(variant, when, problem)
        return reference

    def drop_for_mismatch(self, variant: Any, when: str, problem: str) -> None:
        """No graph from now on: ``variant`` differed from the no-graph output at ``when``."""
        value = getattr(variant, "value", variant)
        self.set_no_graph(SkipReason(SkipCode.NUMERIC_MISMATCH, f"{value} at the {when}: {problem}"))

    # --- transitions -----------------------------------------------------------------------

    def _run_warmup(self, args: Sequence[Any]) -> Any:
        if self.warmups_left <= 0:
            return self._decide(args)
        self.warmups_left -= 1
        self.record.calls += 1
        before = _versions_of(args)
        device = self.runner.plan.device
        assert device is not None
        out = run_on_side_stream(self.runner.compiled, args, device)
        after = _versions_of(args)
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
        self.record.variant = Variant.NO_GRAPH
        self.run = self._run_no_graph

    def release_graph(self) -> None:
        if self.graph is not None:
            self.graph.release()
            self.graph = None
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
            self.kept.append(_KeptGraph(self.graph, self.run, self.verify_calls, self.verify_ptrs))
            self.graph = None

    def _kept_for(self, args: Sequence[Any]) -> _KeptGraph | None:
        for i in range(len(self.kept) - 1, -1, -1):
            if self.kept[i].graph.static_inputs_unmoved(args):
                return self.kept.pop(i)
        return None

    def release(self) -> None:
        self.release_graph()
        self.record.released = True
        self.run = self._run_released

    def _run_released(self, args: Sequence[Any]) -> Any:
        # A released slot (grace.reset) starts over as a fresh one on its next call.
        self.record.released = False
        self.warmups_left = self.runner.options.warmup_calls
        self.run = self._run_warmup
        return self.run(args)

    def _replay_failed(self, args: Sequence[Any], exc: Exception) -> Any:
        self.set_no_graph(SkipReason(SkipCode.REPLAY_FAILED, f"{type(exc).__name__}: {exc}"))
        return self._run_no_graph(args)

    def _static_moved(self, args: Sequence[Any]) -> Any:
        kept = self._kept_for(args)
        if kept is not None:  # a graph captured for these very addresses: use it again
            self._keep_current()
            self.graph, self.run = kept.graph, kept.run
            self.verify_calls, self.verify_ptrs = kept.verify_calls, kept.verify_ptrs
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
                f"re-captured after a parameter moved ({self._moved_static_text(args)})",
            )
        )
        self._keep_current()
        return self._decide(args)

    def _rebind(self, args: Sequence[Any]) -> CapturedGraph | None:
        if not self.runner.options.rebind or self.graph is None or self.rebind_blocked:
            return None
        from grace.decide import rebind_graph

        with self.runner.lock:
            return rebind_graph(self, args)

    def _moved_static_text(self, args: Sequence[Any]) -> str:
        graph = self.graph
        if graph is None:
            return "no graph"
        moved = [i for i in graph.static_indices if args[i].data_ptr() != graph.static_ptrs[i]]
        shown = ", ".join(f"input {i} {tuple(args[i].shape)}" for i in moved[:3])
        more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
        return f"{len(moved)} of {len(graph.static_indices)} static inputs: {shown}{more}"

    def _decide(self, args: Sequence[Any]) -> Any:
        from grace.decide import decide

        with self.runner.lock:
            return decide(self, args)


class _RecentSlot:
    """The slot of the last call, with a check that this call has its signature without rebuilding it.

    The tensor check (``torch_compat.tensor_metadata_check``) is stricter than the signature (it also
    compares device, dispatch keys and requires_grad), so a match always means the same signature and a
    mismatch only sends the call down the full path. Scalars are compared with their types, as in the
    signature."""

    __slots__ = ("_check", "_scalar_values", "_scalars", "_tensors", "slot")

    def __init__(
        self,
        slot: GraphSlot,
        check: Callable[..., bool],
        tensors: Picker,
        scalars: Picker,
        scalar_values: tuple[tuple[type, Any], ...],
    ) -> None:
        self.slot = slot
        self._check = check
        self._tensors = tensors
        self._scalars = scalars
        self._scalar_values = scalar_values

    @classmethod
    def build(cls, plan: RunnerPlan, args: Sequence[Any], slot: GraphSlot) -> _RecentSlot | None:
        tensors = picker(plan.dynamic_indices)
        check = torch_compat.tensor_metadata_check(tensors(args))
        if check is None:
            return None
        scalars = picker(plan.scalar_indices)
        return cls(slot, check, tensors, scalars, tuple((type(v), v) for v in scalars(args)))

    def matches(self, args: Sequence[Any]) -> bool:
        if self._scalar_values and tuple((type(v), v) for v in self._scalars(args)) != self._scalar_values:
            return False
        return bool(self._check(*self._tensors(args)))


class GraceRunner:
    """The callable Dynamo gets back for one FX graph."""

    _next_id = 0

    def __init__(
        self,
        compiled: Callable[..., Any],
        plan: RunnerPlan,
        options: GraceOptions,
        environment: Environment | None,
    ) -> None:
        GraceRunner._next_id += 1
        self.callable_id = GraceRunner._next_id
        self.compiled = compiled
        self.plan = plan
        self.options = options
        self.environment = environment
        # Held for each whole call (and by reset/release): see "Threads and streams" above.
        self.lock = threading.RLock()
        self.slots: OrderedDict[Any, GraphSlot] = OrderedDict()
        self._adapter = plan.input_adapter
        self._recent: _RecentSlot | None = None
        self._skip_record: grace_stats.GraphStats | None = None
        device = plan.device
        # The device whose context a call's driver work needs current in the calling thread (None: no
        # graphs, so no driver work).
        graphs_possible = plan.skip is None and device is not None and device.type == "cuda"
        self._context_device: int | None = (device.index or 0) if graphs_possible and device else None
        if plan.skip is not None:
            record = grace_stats.new_record(
                self.callable_id, plan.graph_hash, "*", str(plan.device) if plan.device else "none"
            )
            record.variant = Variant.NO_GRAPH
            record.add_skip(plan.skip)
            log_once(plan.skip, f"compiled graph {plan.graph_hash}")
            self._skip_record = record
        _live_runners.add(self)

    def signature(self, args: Sequence[Any]) -> tuple[Any, ...]:
        parts: list[Any] = []
        for i in self.plan.dynamic_indices:
            t = args[i]
            parts.append((t.shape, t.stride(), t.dtype))
        for i in self.plan.scalar_indices:
            parts.append((type(args[i]), args[i]))
        return tuple(parts)

    def __call__(self, *args: Any) -> Any:
        pools.release_unheld()  # released graphs whose held outputs have been dropped since (grace.pools)
        calling_threads.note()  # Note: [Outputs and threads] in grace.capture
        if self._context_device is not None:
            cuda_compat.ensure_context_current(self._context_device)  # a thread's first call
        with self.lock:  # the whole call, from the input check to the outputs (module docstring)
            return self._call(args)

    def _call(self, args: tuple[Any, ...]) -> Any:
        adapter = self._adapter
        if adapter is None:
            return self._call_adapted(args)
        out = self._call_adapted(tuple(adapter(list(args))))
        adapter.returned(out)  # grace.adapting: no output may live in memory the adapter reuses
        return out

    def _call_adapted(self, args: tuple[Any, ...]) -> Any:
        record = self._skip_record
        if record is not None:
            record.calls += 1
            return self.compiled(*args)
        recent = self._recent
        if recent is not None and recent.matches(args):
            return recent.slot.run(args)  # the most recently used slot: already last in the LRU order
        key = self.signature(args)
        slot = self.slots.get(key)
        if slot is None:
            slot = self._new_slot(key)
        else:
            self.slots.move_to_end(key)
        if slot.recent is None:  # once per slot: signatures that alternate pay no rebuild
            slot.recent = _RecentSlot.build(self.plan, args, slot)
        self._recent = slot.recent if self.slots.get(key) is slot else None
        return slot.run(args)

    def _new_slot(self, key: tuple[Any, ...]) -> GraphSlot:
        with self.lock:
            slot = GraphSlot(self, describe_signature(key))
            self.slots[key] = slot
            while len(self.slots) > self.options.max_graphs_per_callable:
                _, evicted = self.slots.popitem(last=False)
                recent = self._recent
                if recent is not None and recent.slot is evicted:
                    self._recent = None
                evicted.release()
            return slot

    def release(self) -> None:
        """Release every graph and pool; slots start over on their next call."""
        with self.lock:
            for slot in self.slots.values():
                slot.release()

    def reset(self) -> None:
        with self.lock:
            self._recent = None
            for slot in self.slots.values():
                slot.release()
            self.slots.clear()

    def decision_key(self, slot: GraphSlot, candidates: Sequence[Variant]) -> DecisionKey | None:
        env = self.environment
        if env is None:
            return None
        return DecisionKey(
            graph_hash=self.plan.graph_hash,
            signature=slot.signature_text,
            gpu=env.gpu,
            driver=env.driver,
            cuda_runtime=env.cuda_runtime,
            torch=env.torch,
            triton=env.triton,
            candidates=tuple(v.value for v in candidates),
        )


def describe_signature(key: tuple[Any, ...]) -> str:
    """A readable, stable text of a signature (also the decision cache's signature field)."""
    parts = []
    for part in key:
        if len(part) == 3:
            shape, stride, dtype = part
            parts.append(f"{str(dtype).replace('torch.', '')}{list(shape)}/{list(stride)}")
        else:
            kind, value = part
            parts.append(f"{kind.__name__}={value!r}")
    return ";".join(parts)


_live_runners: weakref.WeakSet[GraceRunner] = weakref.WeakSet()


def release_callables(callable_ids: set[int]) -> int:
    """Release the graphs of the live runners with these ids; returns how many were released."""
    runners = [r for r in list(_live_runners) if r.callable_id in callable_ids]
    for runner in runners:
        runner.release()
    pools.release_unheld()
    return len(runners)


def release_all() -> int:
    """Release the graphs of every live runner; returns how many runners there were. A pool whose
    outputs the caller still holds is released once they are dropped (grace.pools)."""
    runners = list(_live_runners)
    for runner in runners:
        runner.reset()
    pools.release_unheld()
    calling_threads.forget()  # graphs made from now on start with one thread again
    return len(runners)
