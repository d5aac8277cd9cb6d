"""Hoisted CPU inputs copied into one fixed device home per layout (grace.cgct.adapter, Note: [A fixed
home for hoisted inputs]): the graph gets the same addresses on every call, each call's values, and no
output handed back ever lives in memory a later call rewrites. CPU tests (the "device" is the CPU);
the end-to-end checks on a GPU are in tests/test_hoist_homes_gpu.py."""

from __future__ import annotations

import torch

from grace.cgct.adapter import HoistBatch, HoistStep, InputAdapter

CPU = torch.device("cpu")


def _adapter(count: int) -> tuple[InputAdapter, HoistBatch]:
    adapter = InputAdapter([HoistStep(index=i, device=CPU) for i in range(count)])
    (batch,) = adapter._plan
    assert isinstance(batch, HoistBatch)
    return adapter, batch


def _scalars(call: int, count: int = 3) -> list[torch.Tensor]:
    return [torch.tensor(float(call * 10 + i)) for i in range(count)]


def test_every_call_gets_the_same_addresses_with_its_own_values() -> None:
    adapter, batch = _adapter(3)
    pointers = None
    for call in range(12):  # more calls than the staging ring has buffers
        inputs = _scalars(call)
        out = adapter(inputs)
        adapter.returned(out[0] * 2)  # an output that is not in the home
        assert [float(t) for t in out] == [float(t) for t in inputs]
        got = [t.data_ptr() for t in out]
        assert pointers is None or got == pointers
        pointers = got
    assert batch.reuse_homes and batch.batched_calls == 12


def test_a_new_layout_gets_its_own_home() -> None:
    adapter, _ = _adapter(2)
    scalars = adapter(_scalars(0, 2))
    adapter.returned(None)
    rows = adapter([torch.ones(3), torch.zeros(3)])
    adapter.returned(None)
    assert scalars[0].untyped_storage().data_ptr() != rows[0].untyped_storage().data_ptr()
    again = adapter(_scalars(1, 2))
    assert [t.data_ptr() for t in again] == [t.data_ptr() for t in scalars]
    assert [float(t) for t in again] == [10.0, 11.0]


def test_an_output_in_the_home_ends_the_reuse_and_keeps_its_value() -> None:
    """A graph that returns a hoisted input (``return ids.to("cuda")``): eager returns a fresh tensor
    each call, so the output the caller holds must keep the first call's value."""
    adapter, batch = _adapter(3)
    first = adapter(_scalars(0))
    held = first[1].view(1)  # a view of a hoisted input, as AOTAutograd regenerates one
    adapter.returned((held, torch.ones(1)))
    assert not batch.reuse_homes
    for call in range(1, 4):
        out = adapter(_scalars(call))
        adapter.returned((out[1].view(1),))
        assert [float(t) for t in out] == [call * 10.0, call * 10.0 + 1, call * 10.0 + 2]
        assert out[1].untyped_storage().data_ptr() != held.untyped_storage().data_ptr()
    assert float(held) == 1.0


def test_outputs_are_looked_at_once_per_layout() -> None:
    adapter, batch = _adapter(2)
    adapter.returned(adapter(_scalars(0, 2)) and None)
    out = adapter(_scalars(1, 2))
    adapter.returned(out)  # the layout was confirmed by the first call: no longer looked at
    assert batch.reuse_homes
