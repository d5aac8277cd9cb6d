"""The safe path under every runner: what a call runs when grace's own code fails.

Problem: grace's runtime (capture, PI, the runner's checks) is code that can fail on some torch, Triton,
CUDA or model, and the backend promises never to raise for its own failures (Note: [The backend never
raises for its own failures] in grace.backend) nor to run a call's side effects twice.

Design: ``SafePath`` is one graph without grace's runtime: Inductor's callable on the adapted inputs,
or the graph as Dynamo traced it run eagerly when CGCT's adapter itself raises. ``GuardedRunner`` is
what Dynamo (or AOTAutograd, for a training graph: grace.training) calls: the grace runner until it
raises, then the safe path for that call and every later one, with the reason recorded.
``CountedCallable`` counts the compiled callable's runs, so that a failure after a run of a callable
that mutates its inputs, or of one that took the call's inputs (grace.boxing), is not retried.

Invariant: a call that already ran a callable that mutates its inputs, or that emptied the call's
``Inputs``, is never run again; the error then propagates. When the safe path raises too, the error is
the model's and propagates unchanged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from grace import boxing
from grace import stats as grace_stats
from grace.adapting import InputAdapting
from grace.boxing import Inputs, TakesList
from grace.reasons import SkipCode, SkipReason, log_once
from grace.runner import GraceRunner
from grace.scg import Variant

logger = logging.getLogger(__name__)


class CountedCallable(TakesList):
    """``fn`` counting its calls (a plain counter: another thread's call only makes it more cautious);
    the call's ``Inputs`` go on to ``fn`` (grace.boxing)."""

    __slots__ = ("calls", "fn")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.fn(*args)

    def call_list(self, inputs: Inputs) -> Any:
        self.calls += 1
        return boxing.run(self.fn, inputs)


class SafePath:
    """One graph without grace's runtime: Inductor's callable on the adapted inputs, or Dynamo's graph
    run eagerly when the CGCT adapter itself raises."""

    def __init__(
        self,
        compiled: CountedCallable,
        adapter: InputAdapting | None,
        eager: Callable[..., Any],
    ) -> None:
        self.compiled = compiled
        self.adapter = adapter
        self.eager = eager
        self.lock = threading.Lock()  # grace.adapting: one call at a time through an adapter

    def __call__(self, args: Sequence[Any]) -> Any:
        adapter = self.adapter
        if adapter is None:
            return boxing.run(self.compiled, args)
        with self.lock:
            try:
                adapted = adapter(list(args))
            except Exception as exc:
                reason = SkipReason(
                    SkipCode.RUNNER_FAILED, f"CGCT's adapter raised {type(exc).__name__}: {exc}"
                )
                log_once(reason, "safe path: the graph as Dynamo traced it, run eagerly", logging.WARNING)
                return self.eager(*args)
            out = self.compiled(*adapted)
            adapter.returned(out)
            return out


class GuardedRunner:
    """What Dynamo calls for one graph: the grace runner until grace's own code fails during a call,
    then the safe path (Note: [The backend never raises for its own failures])."""

    def __init__(self, runner: GraceRunner | None, safe: SafePath) -> None:
        self.runner = runner
        self.safe = safe
        self.reason: SkipReason | None = None
        self.record: grace_stats.GraphStats | None = None

    @classmethod
    def failed(cls, safe: SafePath, graph_hash: str, reason: SkipReason) -> GuardedRunner:
        """A guard with no runner: grace failed to build one, every call takes the safe path."""
        guard = cls(None, safe)
        guard._fall_back(reason, graph_hash, "none")
        return guard

    @property
    def callable_id(self) -> int | None:
        return self.runner.callable_id if self.runner is not None else None

    def __call__(self, *args: Any) -> Any:
        return self.run(args)

    def run(self, args: Sequence[Any]) -> Any:
        """One call on ``args`` (a tuple, or the ``Inputs`` of grace.boxing, which a run may empty)."""
        runner = self.runner
        if self.reason is None and runner is not None:
            before = self.safe.compiled.calls
            try:
                return runner.run(args)
            except Exception as exc:
                return self._after_failure(runner, args, exc, before)
        if self.record is not None:
            self.record.calls += 1
        return self.safe(args)

    def _after_failure(self, runner: GraceRunner, args: Sequence[Any], exc: Exception, before: int) -> Any:
        taken = type(args) is Inputs and not args  # emptied by the run (grace.boxing)
        if self.safe.compiled.calls != before and (_mutates(runner) or taken):
            raise exc  # its side effects may have happened, or it took the inputs: no second run
        try:
            out = self.safe(args)
        except Exception as again:
            raise again from None  # the safe path fails as well: the error is the model's, not grace's
        logger.debug("grace: the runner raised; the safe path did not", exc_info=exc)
        reason = SkipReason(SkipCode.RUNNER_FAILED, f"{type(exc).__name__}: {exc}")
        device = str(runner.plan.device) if runner.plan.device is not None else "none"
        self._fall_back(reason, runner.plan.graph_hash, device, runner.callable_id)
        try:
            runner.reset()  # its graphs and pools are not used any more
        except Exception:
            logger.debug("grace: releasing the failed runner raised", exc_info=True)
        if self.record is not None:
            self.record.calls += 1
        return out

    def _fall_back(self, reason: SkipReason, graph_hash: str, device: str, callable_id: int = 0) -> None:
        record = grace_stats.new_record(callable_id, graph_hash, "*", device, Variant.NO_GRAPH)
        record.add_skip(reason)
        self.record, self.reason = record, reason
        log_once(reason, f"compiled graph {graph_hash}", logging.WARNING)


def _mutates(runner: GraceRunner) -> bool:
    """Whether the runner's callable may mutate its inputs (from the graph or seen at run time)."""
    return bool(runner.plan.mutated_indices) or any(slot.mutated for slot in list(runner.slots.values()))
