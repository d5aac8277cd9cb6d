"""What the runtime knows about one compiled callable and one of its slots, as plain frozen records.

Problem: the runner (grace.runner, grace.slot), the deciding call (grace.decide) and the graph
variants (grace.variants) all read the same facts: the callable's input plan from the backend, the
options, the slot's stats record and the inputs it writes. Passing the slot object itself let the
deciding call write the slot's internals and made the runner and the deciding call import each other.

Design: ``RunnerPlan`` is what the backend learned about a callable's inputs; ``Environment`` the parts
of a decision key that do not depend on the graph; ``SlotFacts`` is what a slot hands the deciding call
and a rebind: read-only facts plus the slot's stats record (which the deciding call fills with node
counts and skip reasons). This module imports neither the runner nor the deciding call.

Invariant: nothing here holds a reference back to a slot; the deciding call can change a slot only
through the ``SlotDecision`` it returns (Note: [Slot states] in grace.runner).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from grace.adapting import InputAdapting
from grace.capture import CaptureContext
from grace.compat.aot import GraphRole
from grace.options import GraceOptions
from grace.poolgroups import PoolGroup, step_group
from grace.reasons import SkipReason
from grace.scg import Decision, DecisionKey, Variant
from grace.stats import GraphStats

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
    role: GraphRole = GraphRole.INFERENCE  # a graph of AOTAutograd's training pair (grace.training)
    kept_from: int | None = None  # Note: [Outputs autograd keeps] in grace.outputs; None: inference
    seed_outputs: tuple[int, ...] = ()  # outputs whose device is the stream's mode (grace.philox)
    undefined_outputs: tuple[int, ...] = ()  # outputs no check compares (grace.philox)

    def step_pool_planned(self, options: GraceOptions) -> bool:
        """Whether this callable's captures go into its device's step pool (``step_pool``), where it
        can tell footprints (``step_pool`` returns None where it cannot)."""
        return options.step_pool and self.role is not GraphRole.INFERENCE and self.device is not None

    def step_pool(self, options: GraceOptions) -> PoolGroup | None:
        """The pool a training graph's captures share with the device's other training graphs (option
        ``step_pool``, Note: [A training step in one pool] in grace.poolgroups), or None: its own."""
        return step_group(self.device) if self.step_pool_planned(options) else None


@dataclass(frozen=True)
class Environment:
    """The parts of a decision key that do not depend on the graph."""

    gpu: str
    driver: str
    cuda_runtime: str
    torch: str
    triton: str


@dataclass(frozen=True)
class SlotFacts:
    """What the deciding call and a rebind read of one slot (built by the slot for each of them).

    ``mutated``: the inputs the callable writes, sorted (the plan's and those warm-up calls saw);
    ``previous``: the slot's last decision (a decision for moved static inputs keeps it when it still
    applies); ``decision_key``: the persisted decision's key for a set of candidates (None: none);
    ``pool_group``: the pool the captures go into (None: a private pool each), shared with the other
    members of the group; the slot's ``record`` tells its graphs from theirs."""

    compiled: Callable[..., Any]
    plan: RunnerPlan
    options: GraceOptions
    record: GraphStats
    signature_text: str
    mutated: tuple[int, ...]
    previous: Decision | None
    decision_key: Callable[[Sequence[Variant]], DecisionKey | None]
    pool_group: PoolGroup | None = None  # Note: [Graphs in one pool] in grace.poolgroups

    @property
    def device(self) -> torch.device:
        device = self.plan.device
        assert device is not None, "a slot that decides has a device"
        return device

    @property
    def keeps_pristine(self) -> bool:
        """Whether captures of this slot keep a copy of their graph for grace.rebind."""
        plan = self.plan
        return self.options.rebind and bool(plan.static_indices) and not plan.random_ops


class SlotOwner(Protocol):
    """What a slot (grace.slot) uses of the runner that owns it (grace.runner.GraceRunner)."""

    callable_id: int
    compiled: Callable[..., Any]
    plan: RunnerPlan
    options: GraceOptions
    lock: threading.RLock

    def decision_key(self, signature_text: str, candidates: Sequence[Variant]) -> DecisionKey | None: ...

    def run_compiled(self, args: Sequence[Any]) -> Any: ...
