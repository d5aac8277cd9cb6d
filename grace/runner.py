r"""The graph runner: what ``torch.compile(backend="grace")`` returns to Dynamo for one FX graph.

Problem: one compiled callable is called with many inputs. Each input signature (shapes, strides,
dtypes of the dynamic tensors, values of integer inputs) needs its own CUDA graph, graphs must be
bounded in number, and for each of them one variant runs: no graph, or a graph variant of
grace.variants (with input copies, with parameter indirection). Nothing may produce a wrong result: not
a new shape, not an input at a new address, not a parameter that moved, not a failed capture.

Design: ``GraceRunner`` keys ``GraphSlot`` objects (grace.slot) by signature in an LRU ``OrderedDict``.
Building the signature costs Python work per input on every call; a call that matches the last call's
slot under a C++ tensor check (Dynamo's ``TensorGuards``, stricter than the signature) skips it, and a
call that would only replay that slot's graph is answered by its steady call first (Note: [The steady
call] in grace.steady), which checks the same conditions in one frame. Each
slot is a state machine (Note: [Slot states]); its deciding call (grace.decide) returns a frozen
decision the slot applies. Safety net (grace.verify): the deciding call's returned replay, the call
after it and the first call whose dynamic inputs sit at new addresses are compared with the no-graph
callable once per graph; a mismatch returns the no-graph output and falls back with
``numeric_mismatch``. Static inputs that move: the slot keeps its graph aside and makes one for the new
addresses, rebound from a copy of the captured graph (grace.rebind: same variant, same pool and
outputs, no deciding call) or captured again; a kept graph is used again when its addresses come back.
This serves one compiled callable shared by several modules of one class, as cudagraph trees re-record.

Note: [Slot states]
A slot (``grace.slot.GraphSlot``) is in one ``SlotState``; ``GraphSlot.run`` dispatches on it:

                 warm-up call (run on the side stream, writes seen by version counters)
                  .--.
                  |  v
    new slot --> WARMUP --- deciding call: grace.decide returns a SlotDecision ---.
                  ^  ^                                                             |
                  |  '--- PENDING: the first run wrote an input the analysis ------+
                  |       missed (that run is the call; decide again next call)    |
                  |                                                                |
                  |         a graph variant (bound with its VariantSpec)           | NO_GRAPH
                  |        .-------------------------------------------------------+ (one candidate,
                  |        v                                                       | slower, failed)
                  |      GRAPH --- replay failed, numeric mismatch, -------> NO_GRAPH
                  |      |  ^      too many recaptures
                  |      '--'  per call: static inputs moved (a kept graph, a rebound graph, or a
                  |            new deciding call); outputs held (this call without the graph); a
                  |            family's outputs held by another layer (a deciding call of its own)
                  |
               RELEASED <--- grace.reset, eviction (any state; the next call starts over)

Note: [Warm-up per signature, not per placement]
Warm-up calls keep signatures seen once from a capture and run the code before one. A call with a
slot's shapes but a dynamic input on another device (a backward given host seeds after its forward ran
without a graph) runs without a graph in a slot of its own, and its calls count as warm-up calls of
the same shapes on the graph's device: a training backward then decides in its forward's deciding
step, while the forward's outputs are still owned (Note: [Outputs a shared pool lends] in
grace.outputs), not one step later, when they are lent. How many warm-up calls: grace.warmup (in a
step's pool, whole steps: Note: [Captures of a step in one step]).

Threads and streams: one lock per compiled callable (``GraceRunner.lock``) is held for each call from
the input check to the hand-out of the outputs, deciding calls, warm-up and checks included. Outputs
another thread received are never overwritten while held (Note: [Outputs and threads] in
grace.outputs), a run on another stream waits for the stream of the graph's previous run (Note:
[Stream order] in grace.streams), and a released graph's pool lives while its outputs are held
(grace.pools; the runner releases waiting pools at the start of each call). A thread whose first CUDA
work is a call of a compiled callable gets the device's primary context made current first
(``grace.compat.cuda.ensure_context_current``).

Invariants (the runtime's; other modules refer to them by this note's name):
- at most one call of a compiled callable runs its runner's code at a time, whatever the threads;
- a slot's state is its ``SlotState``; ``GraphSlot.run`` dispatches on it; the deciding call never
  writes a slot (it returns a ``SlotDecision``); the slot writes its record's variant in one place;
- a graph's copies, table update and replay are queued after all work queued so far on the stream of
  the graph's (or its family's) previous run;
- a slot's graph is used only for inputs with its signature and while its static inputs have the
  addresses they had at capture (checked on every replay; a kept graph only when all of them match);
- a graph that mutates an input is never run more often than the caller calls it, unless every
  extra run (the deciding call's reference and checks, the verified replays of later calls and their
  no-graph reference; SCG does not time such a graph) starts from a restored snapshot of every input
  it may write (grace.rerun); the inputs it may write come from the op schemas (grace.analysis), so
  the rule holds without warm-up calls and under ``inference_mode``. A callable that draws random
  numbers leaves the generators where one run leaves them;
- captures for moved static inputs are bounded by ``max_recaptures`` and rebound graphs by
  ``max_rebinds``; past both the slot has no graph and every graph it kept is released;
- every failure turns the slot into a no-graph slot with the reason in its ``GraphStats``;
- the runner returns exactly the structure the compiled callable returns.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from grace import boxing, pools
from grace import stats as grace_stats
from grace.capture import calling_threads
from grace.compat import cuda as cuda_compat
from grace.compat.aot import GraphRole
from grace.options import GraceOptions
from grace.reasons import SkipCode, SkipReason, log_once
from grace.recent import RecentSlot
from grace.runplan import Environment, PIPrepare, RunnerPlan
from grace.scg import DecisionKey, Variant
from grace.slot import GraphSlot, SlotState
from grace.steady import MISS, STALE, SteadyCall

logger = logging.getLogger(__name__)

_RecentSlot = RecentSlot  # the name the host-path benchmark and older tests use

__all__ = [
    "Environment",
    "GraceRunner",
    "GraphSlot",
    "PIPrepare",
    "RecentSlot",
    "RunnerPlan",
    "SlotState",
    "describe_signature",
    "release_all",
    "release_callables",
]


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
        self._recent: RecentSlot[GraphSlot] | None = None
        self._steady: SteadyCall | None = None  # Note: [The steady call] in grace.steady
        self._steady_tried: weakref.ref[Any] | None = None  # the graph it was last built for
        self._skip_record: grace_stats.GraphStats | None = None
        device = plan.device
        # The device whose context a call's driver work needs current in the calling thread (None: no
        # graphs, so no driver work).
        graphs_possible = plan.skip is None and device is not None and device.type == "cuda"
        self._context_device: int | None = (device.index or 0) if graphs_possible and device else None
        # A backward runs on autograd's device thread, which calls no compiled function: it is no second
        # calling thread for Note: [Outputs and threads] (its own outputs: Note: [Outputs autograd keeps]).
        self._notes_thread = plan.role is not GraphRole.BACKWARD
        if plan.skip is not None:
            device_text = str(plan.device) if plan.device else "none"
            record = grace_stats.new_record(
                self.callable_id, plan.graph_hash, "*", device_text, Variant.NO_GRAPH
            )
            record.add_skip(plan.skip)
            log_once(plan.skip, f"compiled graph {plan.graph_hash}")
            self._skip_record = record
        _live_runners.add(self)

    def signature(self, args: Sequence[Any]) -> tuple[Any, ...]:
        """Shapes, strides and dtypes of the dynamic inputs (with the device, for an input that is not on
        the graph's device at this call), values of the integer inputs."""
        parts: list[Any] = []
        device = self.plan.device
        for i in self.plan.dynamic_indices:
            t = args[i]
            if t.device == device or device is None:
                parts.append((t.shape, t.stride(), t.dtype))
            else:
                parts.append((t.shape, t.stride(), t.dtype, t.device))
        for i in self.plan.scalar_indices:
            parts.append((type(args[i]), args[i]))
        return tuple(parts)

    def __call__(self, *args: Any) -> Any:
        return self.run(args)

    def run(self, args: Sequence[Any]) -> Any:
        """One call on ``args``: a tuple, or the ``Inputs`` of grace.boxing, which only a run of the
        compiled callable without a graph hands on (``run_compiled``)."""
        pools.release_unheld()  # released graphs whose held outputs have been dropped since (grace.pools)
        steady = self._steady
        if steady is not None:  # Note: [The steady call] in grace.steady
            with self.lock:
                out = steady(self._recent, args)
                if out is STALE:
                    self._steady = None
                elif out is not MISS:
                    return out
        if self._notes_thread:
            calling_threads.note()  # Note: [Outputs and threads] in grace.outputs
        if self._context_device is not None:
            cuda_compat.ensure_context_current(self._context_device)  # a thread's first call
        with self.lock:  # the whole call, from the input check to the outputs (module docstring)
            return self._call(args)

    def _call(self, args: Sequence[Any]) -> Any:
        adapter = self._adapter
        if adapter is None:
            return self._call_adapted(args)
        out = self._call_adapted(tuple(adapter(list(args))))
        adapter.returned(out)  # grace.adapting: no output may live in memory the adapter reuses
        return out

    def _call_adapted(self, args: Sequence[Any]) -> Any:
        record = self._skip_record
        if record is not None:
            record.calls += 1
            return self.run_compiled(args)
        recent = self._recent
        if recent is not None and recent.matches(args):
            out = recent.slot.run(args)  # the most recently used slot: already last in the LRU order
            if self._steady is None and self._adapter is None:
                self._offer_steady(recent)
            return out
        key = self.signature(args)
        slot = self.slots.get(key)
        if slot is None:
            slot = self._new_slot(key)
        else:
            self.slots.move_to_end(key)
        if slot.recent is None:  # once per slot: signatures that alternate pay no rebuild
            slot.recent = RecentSlot.build(self.plan, args, slot)
        self._recent = slot.recent if self.slots.get(key) is slot else None
        return slot.run(args)

    def run_compiled(self, args: Sequence[Any]) -> Any:
        """The compiled callable on ``args`` as this call's last use of them (grace.boxing)."""
        return boxing.run(self.compiled, args)

    def _offer_steady(self, recent: RecentSlot[GraphSlot]) -> None:
        """Build the steady call for ``recent``'s graph, once per graph (Note: [The steady call])."""
        graph = recent.slot.graph
        if graph is None or (self._steady_tried is not None and self._steady_tried() is graph):
            return
        self._steady_tried = weakref.ref(graph)
        self._steady = SteadyCall.of(recent, self.options.clone_outputs)

    def _new_slot(self, key: tuple[Any, ...]) -> GraphSlot:
        with self.lock:
            slot = GraphSlot(self, describe_signature(key))
            elsewhere = [p for p in key if len(p) == 4]
            if elsewhere:  # an input on another device than the graph was compiled for: no capture
                slot.set_no_graph(
                    SkipReason(
                        SkipCode.CPU_INPUT,
                        f"a dynamic input is on {elsewhere[0][3]} at run time, not on {self.plan.device} "
                        "as when the graph was compiled: such calls run without a graph",
                    )
                )
            else:
                slot.warmup.skip(self._calls_placed_elsewhere(key))
            self.slots[key] = slot
            while len(self.slots) > self.options.max_graphs_per_callable:
                _, evicted = self.slots.popitem(last=False)
                recent = self._recent
                if recent is not None and recent.slot is evicted:
                    self._recent = self._steady = None
                evicted.release()
            return slot

    def _calls_placed_elsewhere(self, key: tuple[Any, ...]) -> int:
        """Calls already made with ``key``'s shapes, strides, dtypes and values, with some dynamic input
        on another device (Note: [Warm-up per signature, not per placement])."""
        shapes = _without_devices(key)
        return sum(
            slot.record.calls
            for other, slot in self.slots.items()
            if other != key and _without_devices(other) == shapes
        )

    def release(self) -> None:
        """Release every graph and pool; slots start over on their next call."""
        with self.lock:
            self._steady = None
            for slot in self.slots.values():
                slot.release()

    def reset(self) -> None:
        with self.lock:
            self._recent = self._steady = None
            for slot in self.slots.values():
                slot.release()
            self.slots.clear()

    def decision_key(self, signature_text: str, candidates: Sequence[Variant]) -> DecisionKey | None:
        env = self.environment
        if env is None:
            return None
        return DecisionKey(
            graph_hash=self.plan.graph_hash,
            signature=signature_text,
            gpu=env.gpu,
            driver=env.driver,
            cuda_runtime=env.cuda_runtime,
            torch=env.torch,
            triton=env.triton,
            candidates=tuple(v.value for v in candidates),
        )


def _without_devices(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(part[:3] if len(part) == 4 else part for part in key)


def describe_signature(key: tuple[Any, ...]) -> str:
    """A readable, stable text of a signature (also the decision cache's signature field)."""
    parts = []
    for part in key:
        if len(part) in (3, 4):
            shape, stride, dtype = part[:3]
            where = f"@{part[3]}" if len(part) == 4 else ""
            parts.append(f"{str(dtype).replace('torch.', '')}{list(shape)}/{list(stride)}{where}")
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
