"""The steady call (Note: [The steady call] in grace.steady): a plain replay without the general path,
and the general path for every call where anything differs, with the eager value every call. CPU only:
fake captures whose replay computes the callable on what the graph reads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import fakes
import pytest
import torch

import grace.slot
from grace import pools, stats, streams
from grace.compat import torch as torch_compat
from grace.options import GraceOptions
from grace.reasons import SkipCode, SkipReason
from grace.runner import GraceRunner, RunnerPlan
from grace.scg import Variant

CPU = torch.device("cpu")


def _fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * 2 + w


def _fn_writing(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Writes its dynamic input, as a decode step writes its KV cache."""
    x.add_(w)
    return x * 2


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    stats.forget_all()
    streams.calling_threads.forget()  # one calling thread so far, as after grace.reset()
    yield
    stats.forget_all()
    streams.calling_threads.forget()


class _Setup:
    """A runner over ``_fn`` (input 0 dynamic, 1 static) with fake copies-graph captures, the compiled
    call's generation under the test's control and a count of the calls that took the general path."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, fn: Callable[..., torch.Tensor] = _fn, **options: Any
    ) -> None:
        self.fn, self.mutated = fn, (0,) if fn is _fn_writing else ()
        self.generation = 0
        self.general = 0
        monkeypatch.setattr(torch_compat, "compiled_call_generation", lambda: self.generation)
        fakes.cpu_warmup(monkeypatch)

        def make(facts: Any, args: Any) -> Any:
            plan = facts.plan
            return fakes.fake_capture(
                facts.compiled,
                args,
                device=CPU,
                dynamic_indices=plan.dynamic_indices,
                static_indices=plan.static_indices,
                mutated_indices=self.mutated,
            )

        fakes.use_decide(monkeypatch, fakes.decides_graph(make, Variant.GRAPH_COPIES))
        run = grace.slot.GraphSlot.run

        def counted(slot: Any, args: Any) -> Any:
            self.general += 1
            return run(slot, args)

        monkeypatch.setattr(grace.slot.GraphSlot, "run", counted)
        plan = RunnerPlan("h", CPU, static_indices=(1,), dynamic_indices=(0,), scalar_indices=())
        self.runner = GraceRunner(fn, plan, GraceOptions(**options), None)
        self.w = torch.ones(4)

    def call(self, x: torch.Tensor, w: torch.Tensor | None = None, same_call: bool = False) -> None:
        """One compiled call (a new generation unless ``same_call``), checked against eager."""
        if not same_call:
            self.generation += 1
        w = self.w if w is None else w
        expected_x = x.clone()
        expected = self.fn(expected_x, w)
        torch.testing.assert_close(self.runner(x, w), expected)
        torch.testing.assert_close(x, expected_x)  # what the call wrote into its input, too

    def steady(self) -> None:
        """Calls until the slot replays and the steady call is built; the general path's count reset."""
        for step in range(4):
            self.call(torch.full((4,), float(step)))
        assert self.runner._steady is not None
        self.general = 0


def test_steady_calls_replay_without_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = _Setup(monkeypatch)
    setup.steady()
    record = setup.runner._recent.slot.record if setup.runner._recent is not None else None
    assert record is not None
    before = (record.calls, record.graph_calls)
    for step in range(5):
        setup.call(torch.full((4,), 10.0 + step))
    assert setup.general == 0
    assert (record.calls, record.graph_calls) == (before[0] + 5, before[1] + 5)


def test_a_graph_writing_its_input_replays_steadily_and_writes_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The graph reads and writes its dynamic input through a placeholder: a steady call copies it in,
    replays and copies the written value back, as the general path does; every call equals eager's,
    the output and the input both."""
    setup = _Setup(monkeypatch, fn=_fn_writing)
    setup.steady()
    graph = setup.runner._recent.slot.graph if setup.runner._recent is not None else None
    assert graph is not None and graph.mutated_indices == (0,)
    for step in range(5):
        setup.call(torch.full((4,), 10.0 + step))
    assert setup.general == 0


def _second_thread(setup: _Setup) -> None:
    worker = threading.Thread(target=setup.call, args=(torch.full((4,), 7.0),))
    worker.start()
    worker.join()


CHANGES: dict[str, Callable[[_Setup], None]] = {
    "the same compiled call again": lambda s: s.call(torch.full((4,), 5.0), same_call=True),
    "a static input moved": lambda s: s.call(torch.full((4,), 5.0), w=torch.full((4,), 3.0)),
    "another signature": lambda s: s.call(torch.full((2, 4), 5.0)),
    "another thread": _second_thread,
    "a verification due": lambda s: (
        setattr(s.runner._recent.slot, "verify_calls", 1),
        s.call(torch.ones(4)),
    ),
    "outputs shared across threads": lambda s: (
        setattr(s.runner._recent.slot.graph.family, "threads_shared", True),
        s.call(torch.ones(4)),
    ),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_any_change_takes_the_general_path_and_the_eager_value(
    monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    setup = _Setup(monkeypatch)
    setup.steady()
    CHANGES[change](setup)
    assert setup.general >= 1, change
    for step in range(3):  # and every later call is right, whichever path it takes
        setup.call(torch.full((4,), 20.0 + step))


def test_a_pool_waiting_for_its_outputs_is_released_by_a_steady_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A released pool whose output is still held waits (grace.pools); steady calls go on meanwhile,
    and the first one after the output died releases it, as the general path would."""
    setup = _Setup(monkeypatch)
    setup.steady()
    held = torch.zeros(3)
    released: list[bool] = []
    pools.release_when_unheld([torch_compat.storage_weak_ref(held)], lambda: released.append(True))
    setup.call(torch.full((4,), 1.0))
    assert not released and setup.general == 0
    del held
    setup.call(torch.full((4,), 2.0))
    assert released == [True] and setup.general == 0


def test_a_decision_with_addresses_to_check_replays_steadily_until_they_move(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first call with the dynamic inputs elsewhere is compared with the no-graph callable (the
    general path); calls with them where the decision saw them are plain replays."""
    setup = _Setup(monkeypatch)
    x = torch.full((4,), 1.0)
    for _ in range(4):
        setup.call(x)
    slot = setup.runner._recent.slot
    slot.verify_ptrs = [x.data_ptr(), None]
    setup.general = 0
    setup.call(x)
    assert setup.general == 0
    setup.call(torch.full((4,), 2.0))  # elsewhere
    assert setup.general == 1


def test_a_slot_that_moved_on_drops_its_steady_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slot leaves its graph (here: no graph from now on): the next call takes the general path and
    the runner lets the steady call go, with the graph it held."""
    setup = _Setup(monkeypatch)
    setup.steady()
    setup.runner._recent.slot.set_no_graph(SkipReason(SkipCode.REPLAY_FAILED, "test"))
    setup.call(torch.full((4,), 3.0))
    assert setup.general == 1 and setup.runner._steady is None


def test_reset_drops_the_steady_call_and_a_new_graph_gets_one(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = _Setup(monkeypatch)
    setup.steady()
    setup.runner.reset()
    assert setup.runner._steady is None
    setup.steady()
    setup.call(torch.full((4,), 9.0))
    assert setup.general == 0


def test_no_steady_call_where_outputs_are_cloned(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = _Setup(monkeypatch, clone_outputs=True)
    for step in range(6):
        setup.call(torch.full((4,), float(step)))
    assert setup.runner._steady is None
