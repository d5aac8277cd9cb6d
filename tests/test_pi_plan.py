"""PiPlan.update: which address each slot gets, alignment fallbacks, inputs that are not CUDA tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from grace.pi import plan as plan_mod
from grace.pi.plan import PiPlan, Slot, StageLog


class FakeTable:
    bytes_per_copy = 24

    def __init__(self) -> None:
        self.writes: list[list[int]] = []

    def write(self, values: Sequence[int]) -> bool:
        self.writes.append(list(values))
        return True


@dataclass(frozen=True)
class FakeTensor:
    address: int


@pytest.fixture(autouse=True)
def fake_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        plan_mod,
        "device_addresses",
        lambda values: [v.address if isinstance(v, FakeTensor) else None for v in values],
    )


PLACEHOLDERS = {0: 0x1000, 1: 0x2000, 2: 0x3000}


def make_plan(table: FakeTable) -> PiPlan:
    slots = [Slot(0, 0, 16), Slot(1, 64, 16), Slot(1, 0, 1), Slot(2, 0, 16)]
    return PiPlan(table, slots, PLACEHOLDERS, (0, 1, 2, 3), {2: "memcpy node reads it"}, StageLog())


def test_covered_inputs_get_their_address_plus_view_offset() -> None:
    table = FakeTable()
    plan = make_plan(table)
    assert plan.uncovered_indices == (2,)
    inputs = [FakeTensor(0x10000), FakeTensor(0x20000), FakeTensor(0x30000), FakeTensor(0x40000)]
    assert plan.update(inputs) is True
    assert table.writes[-1] == [0x10000, 0x20040, 0x20000, 0x3000]  # input 2 keeps its placeholder
    assert plan.uncovered_indices == (2,)
    assert plan.bytes_per_replay == 24


def test_misaligned_input_falls_back_to_its_placeholder_for_that_call() -> None:
    table = FakeTable()
    plan = make_plan(table)
    inputs = [FakeTensor(0x10000), FakeTensor(0x20004), FakeTensor(0x30000), FakeTensor(0)]
    assert plan.update(inputs) is True
    assert table.writes[-1] == [0x10000, 0x2040, 0x2000, 0x3000]
    assert plan.uncovered_indices == (1, 2)
    assert plan.alignment_fallbacks == 1
    aligned = [FakeTensor(0x10000), FakeTensor(0x50000), FakeTensor(0x30000), FakeTensor(0)]
    assert plan.update(aligned) is True
    assert plan.uncovered_indices == (2,)


def test_an_input_that_is_not_a_cuda_tensor_copies_everything() -> None:
    table = FakeTable()
    plan = make_plan(table)
    assert plan.update([FakeTensor(0x10000), "not a tensor", FakeTensor(0), FakeTensor(0)]) is False
    assert table.writes[-1] == [0x1000, 0x2040, 0x2000, 0x3000]
    assert plan.uncovered_indices == (0, 1, 2, 3)


def test_stages_and_release() -> None:
    log = StageLog()
    log.add("locate", "pass", "1 kernel")
    plan = PiPlan(FakeTable(), [], {}, (), {}, log, keep_alive=[object()])
    assert plan.stages == [("locate", "pass", "1 kernel")]
    plan.release()
    assert plan.slot_count == 0


def _reference(
    slots: Sequence[Slot], placeholders: dict[int, int], static: set[int], inputs: Sequence[FakeTensor]
) -> tuple[list[int], tuple[int, ...]]:
    """The rule of the module docstring, slot by slot: an input is covered this call when it is not
    statically uncovered and every one of its slots' alignments holds for its address plus offset."""
    uncovered = set(static)
    for s in slots:
        if s.index not in static and (inputs[s.index].address + s.delta) % s.alignment:
            uncovered.add(s.index)
    values = [
        (placeholders[s.index] if s.index in uncovered else inputs[s.index].address) + s.delta for s in slots
    ]
    return values, tuple(sorted(uncovered))


@pytest.mark.parametrize("seed", range(200))
def test_update_follows_the_slot_rule(seed: int) -> None:
    import random

    rng = random.Random(seed)
    n = rng.randint(1, 6)
    placeholders = {i: 0x100000 * (i + 1) for i in range(n)}
    slots = [
        Slot(i, rng.choice([0, 0, 0, 4, 8, 64, 100]), rng.choice([1, 4, 8, 16, 16, 16]))
        for i in range(n)
        for _ in range(rng.choice([0, 1, 1, 1, 2, 3]))
    ]
    rng.shuffle(slots)
    with_slots = {s.index for s in slots}
    static = {i for i in with_slots if rng.random() < 0.2}
    table = FakeTable()
    plan = PiPlan(table, slots, placeholders, tuple(range(n)), dict.fromkeys(static, "static"), StageLog())
    for _ in range(4):
        inputs = [
            FakeTensor(0x10000000 * (i + 1) + rng.choice([0, 0, 0, 4, 8, 16, 32, 36])) for i in range(n)
        ]
        assert plan.update(inputs) is True
        values, uncovered = _reference(slots, placeholders, static, inputs)
        assert table.writes[-1] == values
        assert plan.uncovered_indices == uncovered


def test_last_values_skip_a_repeated_write_and_count_both() -> None:
    from grace.pi.table import LastValues

    last = LastValues(2, last=(1, 2))
    assert last.changed([1, 2]) is None and last.skipped == 1
    current = last.changed([1, 3])
    assert current == (1, 3) and last.copies == 0  # due, not yet written
    last.commit(current)
    assert last.changed((1, 3)) is None and (last.copies, last.skipped) == (1, 2)
    with pytest.raises(ValueError, match="3 values for 2 slots"):
        last.changed([1, 2, 3])


def test_the_plan_satisfies_the_whole_contract() -> None:
    from grace.pi_contract import PIPlan, PlanDefaults

    assert isinstance(make_plan(FakeTable()), PIPlan)
    assert make_plan(FakeTable()).launch_preparation_needed

    class Minimal(PlanDefaults):
        uncovered_indices = ()
        bytes_per_replay = 0

        @property
        def stages(self) -> list[tuple[str, str, str]]:
            return []

        def update(self, inputs: Sequence[object]) -> bool:
            return True

    minimal = Minimal()
    assert isinstance(minimal, PIPlan) and not minimal.launch_preparation_needed
    assert minimal.health() is None and dict(minimal.uncovered_reasons) == {}
    with pytest.raises(RuntimeError, match="rebase"):
        minimal.rebase_placeholders({0: 0x10})
