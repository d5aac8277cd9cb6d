"""Captures of a step's pool made in different steps refuse each other's replays, captures made in one
step do not (Note: [Captures of a step in one step] in grace.warmup).

A stand-in of the allocator on the CPU: the pool is eight blocks (tensors of their own), a capture takes
the first free ones as its outputs, and its footprint is every block free at its capture (its outputs
and what its temporaries could take). A once-a-step graph ``P`` runs first in each step and its output
is held through the step; a layer graph ``L`` runs for two layers after it, each layer's output held
through the step too (as saved tensors are).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import fakes
import pytest
import torch

import grace.runplan
import grace.slot
import grace.warmup
from grace import poolgroups, stats
from grace.compat.aot import GraphRole
from grace.options import GraceOptions
from grace.runner import GraceRunner, RunnerPlan
from grace.warmup import Warmup

CPU = torch.device("cpu")


class _Pool:
    """Eight blocks; a block is in use while a member of ``group`` holds it as an output."""

    def __init__(self, group: poolgroups.PoolGroup) -> None:
        self.group = group
        self.blocks = [torch.zeros(2, 3) for _ in range(8)]

    def free(self) -> list[torch.Tensor]:
        used = {o.data_ptr() for m in self.group.members for o in m.outputs}
        return [b for b in self.blocks if b.data_ptr() not in used]

    def capture(self, facts: Any, args: Sequence[Any]) -> Any:
        free = self.free()
        out, placeholder = free[0], torch.zeros(2, 3)
        scale = 3.0 if facts.plan.graph_hash == "P" else 2.0

        class Writes:
            def replay(self) -> None:
                out.copy_(placeholder * scale)

        graph = fakes.captured_graph(Writes(), placeholders={0: placeholder}, outputs=[out], kept_from=0)
        footprint = poolgroups.merged(
            (b.data_ptr(), b.data_ptr() + b.untyped_storage().nbytes()) for b in free
        )
        graph.join_pool_group(facts.pool_group, facts.record, footprint)
        return graph


def _steps(monkeypatch: pytest.MonkeyPatch, by_step: bool) -> dict[str, Any]:
    """Four steps of ``P`` then ``L`` twice; every value checked against eager; the stats of ``L``."""
    generation = [1]
    monkeypatch.setattr(grace.warmup.torch_compat, "compiled_call_generation", lambda: generation[0])
    group = poolgroups.PoolGroup((0, 9))
    monkeypatch.setattr(grace.runplan, "step_group", lambda device: group)
    pool = _Pool(group)
    fakes.cpu_warmup(monkeypatch)
    fakes.use_decide(monkeypatch, fakes.decides_graph(pool.capture))
    if not by_step:  # warm-up counted in calls, as before
        monkeypatch.setattr(grace.slot, "Warmup", lambda left, by_step: Warmup(left))
    stats.forget_all()
    options = GraceOptions(step_pool=True)
    indices: dict[str, Any] = {"static_indices": (), "dynamic_indices": (0,), "scalar_indices": ()}

    def runner(name: str, scale: float) -> GraceRunner:
        plan = RunnerPlan(name, CPU, **indices, role=GraphRole.FORWARD, kept_from=0)
        return GraceRunner(lambda x: [x * scale], plan, options, None)

    once, layer = runner("P", 3.0), runner("L", 2.0)
    for step in range(1, 5):
        generation[0] = step
        x = torch.full((2, 3), float(step))
        held = [(once(x)[0], x * 3)]
        for k in (1, 2):
            y = x + k
            held.append((layer(y)[0], y * 2))
        for value, expected in held:  # nothing held was overwritten by a later replay
            torch.testing.assert_close(value, expected)
        del held, value
    (record,) = (r for r in stats.snapshot() if r["graph_hash"] == "L")
    stats.forget_all()
    return record


def test_in_one_step_no_replay_is_refused_for_another_members_output(monkeypatch: pytest.MonkeyPatch) -> None:
    record = _steps(monkeypatch, by_step=True)
    assert record["graphs_held"] == 2  # a set per layer
    assert not any("overwrite" in reason for reason in record["set_blocks"]), record["set_blocks"]


def test_in_two_steps_the_layer_set_is_refused_for_the_later_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted in calls, ``L`` decides in the first step and ``P`` in the second, inside ``L``'s first
    set's footprint: from then on that set is refused while ``P``'s output is held, every step."""
    record = _steps(monkeypatch, by_step=False)
    assert record["graphs_held"] == 3
    assert any("overwrite" in reason for reason in record["set_blocks"]), record["set_blocks"]
