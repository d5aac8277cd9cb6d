"""Captures of a step's pool made in different steps refuse each other's replays, captures made in one
step do not (Note: [Captures of a step in one step] in grace.warmup).

A stand-in of the allocator on the CPU: the pool is eight blocks (tensors of their own), a capture takes
the first free ones as its outputs, and its footprint is every block free at its capture (its outputs
and what its temporaries could take). A once-a-step graph ``P`` runs first in each step and its output
is held through the step; a layer graph ``L`` runs for two layers after it, each layer's output held
through the step too (as saved tensors are). With ``lends``, a block is free once nothing but the pool
holds it (outputs lent, as on a GPU where the pool's layout is known); then a once-a-step ``P2`` hands
out a result its caller drops at once beside a tensor autograd keeps through the step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import fakes
import numpy as np
import pytest
import torch

import grace.runplan
import grace.slot
import grace.warmup
from grace import poolgroups, stats
from grace.compat import allocator
from grace.compat import torch as torch_compat
from grace.compat.aot import GraphRole
from grace.options import GraceOptions
from grace.runner import GraceRunner, RunnerPlan
from grace.warmup import Warmup

CPU = torch.device("cpu")


SCALES = {"P": (3.0,), "P2": (3.0, 5.0), "L": (2.0,)}  # per graph, the scale of each output


class _Pool:
    """Eight blocks of memory; a capture takes the first free ones for its outputs, and its footprint is
    every block free then. Without ``lends`` a block is in use while a member of ``group`` has it as an
    output. With ``lends`` the memory is arrays whose torch storages are made per capture, and grace
    lends the outputs (Note: [Outputs a shared pool lends] in grace.outputs): a block is free once every
    storage a capture made over it has died, as the allocator frees a block with its last storage."""

    def __init__(self, group: poolgroups.PoolGroup, lends: bool = False) -> None:
        self.group, self.lends = group, lends
        self.blocks = [torch.zeros(2, 3) for _ in range(8)]
        self.arrays = [np.zeros((2, 3), dtype=np.float32) for _ in range(8)]
        self.owners: list[list[Any]] = [[] for _ in range(8)]  # per block, the storages captures made

    def free(self) -> list[int]:
        if self.lends:
            return [
                i for i, refs in enumerate(self.owners) if not any(map(torch_compat.storage_use_count, refs))
            ]
        used = {o.data_ptr() for m in self.group.members for o in m.outputs}
        return [i for i, b in enumerate(self.blocks) if b.data_ptr() not in used]

    def _memory(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Block ``i`` as a capture's own output and as its replay's view."""
        if not self.lends:
            return self.blocks[i], self.blocks[i]
        own = torch.from_numpy(self.arrays[i])
        self.owners[i].append(torch_compat.storage_weak_ref(own))
        return own, torch.from_numpy(self.arrays[i])

    def capture(self, facts: Any, args: Sequence[Any]) -> Any:
        """A capture into the pool, or into a pool of its own (fresh blocks) where grace gave none."""
        free = self.free() if facts.pool_group is not None else []
        scales = SCALES[facts.plan.graph_hash]
        if facts.pool_group is None:
            outs = writers = tuple(torch.zeros(2, 3) for _ in scales)
        else:
            outs, writers = zip(*(self._memory(i) for i in free[: len(scales)]), strict=True)
        placeholder = torch.zeros(2, 3)

        class Writes:
            def replay(self) -> None:
                for out, scale in zip(writers, scales, strict=True):
                    out.copy_(placeholder * scale)

        kept_from = len(scales) - 1  # the last output is the one autograd keeps
        graph = fakes.captured_graph(
            Writes(), placeholders={0: placeholder}, outputs=list(outs), kept_from=kept_from
        )
        if facts.pool_group is None:
            return graph
        graph.pool_positions = frozenset(range(len(outs)))
        footprint = poolgroups.merged(_span(self.arrays[i] if self.lends else self.blocks[i]) for i in free)
        graph.join_pool_group(facts.pool_group, facts.record, footprint)
        return graph


def _span(block: Any) -> tuple[int, int]:
    if isinstance(block, np.ndarray):
        return block.ctypes.data, block.ctypes.data + block.nbytes
    return block.data_ptr(), block.data_ptr() + block.untyped_storage().nbytes()


def _steps(
    monkeypatch: pytest.MonkeyPatch, by_step: bool, once_name: str = "P", **options: Any
) -> dict[str, Any]:
    """Four steps of ``once_name`` (``P`` or ``P2``) then ``L`` twice; every value checked against eager;
    the stats of ``L``, with ``"lent"``: whether each of its sets lent its outputs. ``P2``'s result is
    dropped before ``L`` runs, its kept tensor held to the end; with ``P2`` the pool lends."""
    generation = [1]
    monkeypatch.setattr(grace.warmup.torch_compat, "compiled_call_generation", lambda: generation[0])
    group = poolgroups.PoolGroup((0, 9))
    monkeypatch.setattr(grace.runplan, "step_group", lambda device: group)
    lends = once_name == "P2"
    if lends:
        monkeypatch.setattr(allocator, "has_pool_layout", lambda: True)
    pool = _Pool(group, lends=lends)
    fakes.cpu_warmup(monkeypatch)
    fakes.use_decide(monkeypatch, fakes.decides_graph(pool.capture))
    if not by_step:  # warm-up counted in calls, as before
        monkeypatch.setattr(grace.slot, "Warmup", lambda left, by_step: Warmup(left))
    stats.forget_all()
    grace_options = GraceOptions(step_pool=True, **options)
    indices: dict[str, Any] = {"static_indices": (), "dynamic_indices": (0,), "scalar_indices": ()}

    def runner(name: str) -> GraceRunner:
        scales = SCALES[name]
        plan = RunnerPlan(name, CPU, **indices, role=GraphRole.FORWARD, kept_from=len(scales) - 1)
        return GraceRunner(lambda x: [x * scale for scale in scales], plan, grace_options, None)

    once, layer = runner(once_name), runner("L")
    for step in range(1, 5):
        generation[0] = step
        x = torch.full((2, 3), float(step))
        *result, kept = once(x)
        if result:  # used, then dropped before the layers run
            torch.testing.assert_close(result[0], x * 3)
            del result
        held = [(kept, x * SCALES[once_name][-1])]
        for k in (1, 2):
            y = x + k
            held.append((layer(y)[0], y * 2))
        for value, expected in held:  # nothing held was overwritten by a later replay
            torch.testing.assert_close(value, expected)
        del held, value, kept
    (record,) = (r for r in stats.snapshot() if r["graph_hash"] == "L")
    record["lent"] = [
        bool(m.family.owners)
        for m in group.members
        if getattr(getattr(group.seat(m), "kin", None), "graph_hash", "") == "L"
    ]
    stats.forget_all()
    return record


def test_in_one_step_no_replay_is_refused_for_another_members_output(monkeypatch: pytest.MonkeyPatch) -> None:
    record = _steps(monkeypatch, by_step=True)
    assert record["graphs_held"] == 2, record["skip_reasons"]  # a set per layer
    assert not any("overwrite" in reason for reason in record["set_blocks"]), record["set_blocks"]


def test_in_two_steps_the_layer_set_is_refused_for_the_later_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted in calls, ``L`` decides in the first step and ``P`` in the second, inside ``L``'s first
    set's footprint: from then on that set is refused while ``P``'s output is held, every step."""
    record = _steps(monkeypatch, by_step=False)
    assert record["graphs_held"] == 3
    assert any("overwrite" in reason for reason in record["set_blocks"]), record["set_blocks"]


def test_a_dropped_result_beside_a_kept_tensor_does_not_refuse_the_set_captured_over_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note: [What a replay can overwrite] in grace.poolgroups: ``L``'s first set is captured over the
    block of ``P2``'s dropped result. In every later step that block is free again when ``L`` replays
    while ``P2``'s kept tensor is held: only the storages a footprint meets count, so the set replays
    (counted per member, it was refused until the backward and ``L`` made a set per call)."""
    record = _steps(monkeypatch, by_step=True, once_name="P2")
    assert record["graphs_held"] == 2, record["skip_reasons"]  # a set per layer
    assert not any("overwrite" in reason for reason in record["set_blocks"]), record["set_blocks"]


def test_a_deciding_call_whose_replay_is_refused_makes_no_further_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note: [One new set per call] in grace.outputsets: with the replay check counted per member (as
    before the per-storage check), ``L``'s new set is refused at its deciding call's replay. That call
    runs without a graph instead of making another set inside it (before: four sets in the second step
    for its two calls); every set lends its outputs, also one never replayed, a refused set's first replay
    is checked against the no-graph callable, and every value is eager's."""
    made: Counter[tuple[int, str]] = Counter()
    capture = _Pool.capture

    def counted(pool: _Pool, facts: Any, args: Sequence[Any]) -> Any:
        made[grace.warmup.torch_compat.compiled_call_generation(), facts.plan.graph_hash] += 1
        return capture(pool, facts, args)

    monkeypatch.setattr(_Pool, "capture", counted)
    checked: list[int] = []  # replays compared with the no-graph callable (the fake decision arms none)
    check = grace.slot.check_against_reference

    def counted_check(*args: Any, **kwargs: Any) -> Any:
        checked.append(1)
        return check(*args, **kwargs)

    monkeypatch.setattr(grace.slot, "check_against_reference", counted_check)
    monkeypatch.setattr(poolgroups, "_met", lambda footprint, seat: None)
    record = _steps(monkeypatch, by_step=True, once_name="P2", max_output_sets=16)
    assert any("overwrite" in r for r in record["set_blocks"]), record  # the case under test happened
    assert record["held_output_calls"] >= 1, record
    assert any("deciding call's replay" in r["detail"] for r in record["skip_reasons"]), record
    calls = {"P2": 1, "L": 2}  # per step (the stand-in's call generation is the step)
    assert all(n <= calls[name] for (_, name), n in made.items()) and made[2, "L"] == 2, made
    assert record["lent"] and all(record["lent"]), record["lent"]
    assert checked and record["variant"] != "no_graph", record  # a refused set's first replay, checked
