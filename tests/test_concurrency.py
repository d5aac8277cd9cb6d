"""The runner's rules for threads, streams and released pools, on CPU with stand-in graphs.

A real ``CapturedGraph`` over CPU tensors replays a stand-in CUDA graph that computes ``x * 2`` of its
placeholder into its one output, so that placeholders, outputs and their use counts are the runtime's
own; streams are fakes that log what waits for what. tests/test_concurrency_gpu.py runs the same rules
on a device."""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import fakes
import pytest
import torch

import grace.capture
import grace.decide
import grace.runner
import grace.slot
import grace.streams
from grace import pools, stats
from grace.capture import CapturedGraph
from grace.options import GraceOptions
from grace.pi_contract import PlanDefaults
from grace.runner import GraceRunner, RunnerPlan

CPU = torch.device("cpu")


class _StandIn:
    """A stand-in CUDA graph: each replay writes twice its placeholder into its output, ``delay`` seconds
    after it starts (the window in which another thread could write the placeholder). Like a CUDA graph
    it knows its output by address only: it holds no tensor of it, so use counts are the runtime's."""

    def __init__(self, name: str, out: torch.Tensor, x: torch.Tensor, log: list[str], delay: float) -> None:
        self.name, self.x, self.log, self.delay = name, x, log, delay
        self.out_ptr, self.out_bytes = out.data_ptr(), out.nbytes

    def replay(self) -> None:
        self.log.append(f"replay {self.name}")
        if self.delay:
            time.sleep(self.delay)
        result = (self.x * 2).contiguous()
        ctypes.memmove(self.out_ptr, result.data_ptr(), self.out_bytes)

    def reset(self) -> None:
        self.log.append(f"reset {self.name}")


def _graph(x: torch.Tensor, name: str, log: list[str], delay: float = 0.0) -> CapturedGraph:
    placeholder = torch.zeros_like(x)
    static_out = torch.zeros_like(x)
    outputs: list[Any] = [static_out]
    return fakes.captured_graph(
        _StandIn(name, static_out, placeholder, log, delay),
        placeholders={1: placeholder},
        outputs=outputs,
        static_ptrs=[None, None, None],
    )


@pytest.fixture
def make_runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., tuple[GraceRunner, list[str]]]]:
    """``make_runner(delay=..., **options)``: a runner whose deciding call captures a ``_graph`` per
    signature; every call is a new compiled call (Dynamo's generation count)."""
    generations = itertools.count(1)
    fakes.cpu_warmup(monkeypatch)
    monkeypatch.setattr(grace.slot.torch_compat, "compiled_call_generation", lambda: next(generations))
    stats.forget_all()

    def make(delay: float = 0.0, **options: Any) -> tuple[GraceRunner, list[str]]:
        log: list[str] = []

        def capture(facts: Any, args: Sequence[Any]) -> CapturedGraph:
            name = f"g{sum(1 for e in log if e.startswith('capture'))}"
            log.append(f"capture {name}")
            return _graph(args[1], name, log, delay)

        fakes.use_decide(monkeypatch, fakes.decides_graph(capture))
        plan = RunnerPlan("h", device=CPU, static_indices=(), dynamic_indices=(1,), scalar_indices=(2,))
        return GraceRunner(lambda w, x, n: [x * 2], plan, GraceOptions(**options), None), log

    yield make
    grace.runner.release_all()
    stats.forget_all()


def _in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` run in a thread of its own (to completion)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


def _record() -> dict[str, Any]:
    (record,) = stats.snapshot()
    return record


# --- threads ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [2, 4])
def test_calls_from_several_threads_never_mix_their_inputs(
    make_runner: Callable[..., tuple[GraceRunner, list[str]]], threads: int
) -> None:
    """The runner's lock covers a whole call: no thread copies its input into the placeholder while
    another thread's replay has yet to read it (the stand-in reads it 2 ms into its replay)."""
    runner, _ = make_runner(delay=0.002, clone_outputs=True)
    w = torch.ones(())
    runner(w, torch.zeros(2, 3), 1)  # warm-up and deciding call before the threads start
    runner(w, torch.zeros(2, 3), 1)
    wrong: list[tuple[int, int]] = []

    def work(k: int) -> None:
        for call in range(12):
            x = torch.full((2, 3), float(100 * k + call))
            (out,) = runner(w, x, 1)
            if not torch.equal(out, x * 2):
                wrong.append((k, call))

    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert wrong == []
    assert _record()["graph_launches"] == 1 + 12 * threads  # every call replayed: nothing fell back


def test_outputs_another_thread_holds_are_never_overwritten(
    make_runner: Callable[..., tuple[GraceRunner, list[str]]],
) -> None:
    """Note: [Outputs and threads]: the main thread holds the graph's own output tensor when a second
    thread calls; with one set of outputs (Note: [Output sets] in grace.outputsets) that call runs without
    the graph, and later replays wait until nothing is held."""
    runner, log = make_runner(max_output_sets=1)
    w = torch.ones(())
    xa, xb, xc, xd = (torch.full((2, 3), float(v)) for v in (1, 2, 3, 4))
    runner(w, torch.zeros(2, 3), 1)  # warm-up
    runner(w, torch.zeros(2, 3), 1)  # the deciding call's replay
    (a,) = runner(w, xa, 1)  # the graph's own output tensor, held here
    graph = next(iter(runner.slots.values())).graph
    assert graph is not None and a is graph.outputs[0]
    del graph
    launches = _record()["graph_launches"]
    (b,) = _in_thread(lambda: runner(w, xb, 1))
    torch.testing.assert_close(a, xa * 2)  # not overwritten by the other thread's call
    torch.testing.assert_close(b, xb * 2)
    assert _record()["graph_launches"] == launches and _record()["held_output_calls"] == 1
    del a
    (c,) = _in_thread(lambda: runner(w, xc, 1))  # nothing held any more: replayed
    torch.testing.assert_close(c, xc * 2)
    assert _record()["graph_launches"] == launches + 1
    (d,) = runner(w, xd, 1)  # ``c`` (an alias of the pool's output) is held: no replay
    torch.testing.assert_close(c, xc * 2)
    torch.testing.assert_close(d, xd * 2)
    assert _record()["graph_launches"] == launches + 1
    del c, d
    (e,) = runner(w, xa, 1)
    torch.testing.assert_close(e, xa * 2)
    assert _record()["graph_launches"] == launches + 2
    assert log.count("capture g0") == 1


def test_threads_holding_outputs_with_outputs_not_cloned_always_see_their_values(
    make_runner: Callable[..., tuple[GraceRunner, list[str]]],
) -> None:
    """Several threads keep each result while they check it and while they make their next call."""
    runner, _ = make_runner(delay=0.001)
    w = torch.ones(())
    runner(w, torch.zeros(2, 3), 1)
    runner(w, torch.zeros(2, 3), 1)
    wrong: list[tuple[int, int]] = []

    def work(k: int) -> None:
        previous: tuple[torch.Tensor, torch.Tensor] | None = None
        for call in range(10):
            x = torch.full((2, 3), float(100 * k + call))
            (out,) = runner(w, x, 1)
            time.sleep(0.0005)
            if not torch.equal(out, x * 2) or (previous is not None and not torch.equal(*previous)):
                wrong.append((k, call))
            previous = (out, x * 2)
            if call % 3 == 2:
                previous = None

    workers = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert wrong == []


def test_a_thread_keeps_its_layers_outputs_while_other_threads_call_other_models(
    make_runner: Callable[..., tuple[GraceRunner, list[str]]],
) -> None:
    """Note: [Outputs and threads]: Dynamo's call count is shared by threads, so another thread's calls
    (here of another compiled model) move it in the middle of this thread's call; a piece run once per
    layer must still not overwrite the output of the layer before, which this thread holds."""
    mine, _ = make_runner()
    theirs, _ = make_runner()
    w = torch.ones(())
    for _ in range(3):
        mine(w, torch.zeros(2, 3), 1)
    _in_thread(lambda: theirs(w, torch.zeros(2, 3), 1))
    layer_one = torch.full((2, 3), 1.0)
    (first,) = mine(w, layer_one, 1)  # a new generation for each call, as another thread's calls give
    (second,) = mine(w, torch.full((2, 3), 2.0), 1)
    torch.testing.assert_close(first, layer_one * 2)  # not overwritten by the next layer's call
    torch.testing.assert_close(second, torch.full((2, 3), 4.0))


# --- streams ---------------------------------------------------------------------------------------


class _Stream:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: _Stream) -> None:
        self.log.append(f"{self.name} waits for {other.name}")


def test_a_run_on_another_stream_waits_for_the_previous_runs_stream_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note: [Stream order]: a lone graph (no family) too; the wait comes before the input copy."""
    log: list[str] = []
    streams = {"now": _Stream("a", log)}
    monkeypatch.setattr(grace.streams, "current_stream", lambda device: streams["now"], raising=False)
    monkeypatch.setattr(grace.streams, "current_stream_key", lambda device: id(streams["now"]), raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: streams["now"])
    real_copy = grace.capture.torch_compat.foreach_copy

    def logged_copy(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
        log.append("copy in")
        real_copy(dsts, srcs)

    monkeypatch.setattr(grace.capture.torch_compat, "foreach_copy", logged_copy)
    x = torch.ones(2, 3)
    graph = _graph(x, "g", log)
    args = [torch.ones(()), x, 1]
    graph.run_with_copies(args, clone=False)
    graph.run_with_copies(args, clone=False)
    streams["now"] = _Stream("b", log)
    out = graph.run_with_copies(args, clone=True)
    torch.testing.assert_close(out[0], x * 2)
    assert log == ["copy in", "replay g", "copy in", "replay g", "b waits for a", "copy in", "replay g"]
    streams["now"] = _Stream("a", log)
    graph.run_with_copies(args, clone=False)
    assert log[-3:] == ["a waits for b", "copy in", "replay g"]


class _Plan(PlanDefaults):
    """A PI plan that serves every input through its table and logs its table writes."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.uncovered_indices: tuple[int, ...] = ()
        self.bytes_per_replay = 8
        self.stages: list[tuple[str, str, str]] = []

    def update(self, inputs: Sequence[Any]) -> bool:
        self.log.append("table")
        return True


def test_a_pi_run_on_another_stream_waits_before_its_table_update(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    streams = {"now": _Stream("a", log)}
    monkeypatch.setattr(grace.streams, "current_stream", lambda device: streams["now"], raising=False)
    monkeypatch.setattr(grace.streams, "current_stream_key", lambda device: id(streams["now"]), raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: streams["now"])
    x = torch.ones(2, 3)
    graph = _graph(x, "g", log)
    graph.pi_plan = _Plan(log)
    args = [torch.ones(()), x, 1]
    graph.run_with_pi(args, clone=False)
    streams["now"] = _Stream("b", log)
    graph.run_with_pi(args, clone=False)
    assert log == ["table", "replay g", "b waits for a", "table", "replay g"]


# --- pools of released graphs ----------------------------------------------------------------------


def test_an_evicted_graphs_pool_lives_while_its_output_is_held(
    make_runner: Callable[..., tuple[GraceRunner, list[str]]],
) -> None:
    """grace.pools: past ``max_graphs_per_callable`` the oldest slot is released, but the pool of its
    graph (the stand-in's reset) waits for the caller to drop the output it holds."""
    runner, log = make_runner(max_graphs_per_callable=1)
    waiting = pools.waiting()  # (stand-ins of other tests may hold theirs)
    w = torch.ones(())
    small = torch.full((2, 3), 1.0)
    for _ in range(2):
        runner(w, small, 1)
    (kept,) = runner(w, small, 1)  # held by the caller
    for _ in range(3):  # another shape: the first slot is evicted
        (other,) = runner(w, torch.full((4, 3), 2.0), 1)
        torch.testing.assert_close(other, torch.full((4, 3), 4.0))
    assert len(runner.slots) == 1 and "reset g0" not in log and pools.waiting() == waiting + 1
    assert stats.pools_waiting() == pools.waiting()
    torch.testing.assert_close(kept, small * 2)
    del kept
    runner(w, torch.full((4, 3), 2.0), 1)  # the next call finds nothing held: released
    assert log.count("reset g0") == 1 and pools.waiting() == waiting


def test_a_graph_released_with_nothing_held_frees_its_pool_at_once() -> None:
    log: list[str] = []
    waiting = pools.waiting()
    graph = _graph(torch.ones(2, 3), "g", log)
    graph.collect_outputs([], clone=True)  # a clone: nothing of the pool is out
    graph.release()
    graph.release()  # a second release does nothing
    assert log == ["reset g"] and pools.waiting() == waiting


def test_reset_releases_every_graph_and_a_held_pool_once_its_outputs_are_dropped(
    make_runner: Callable[..., tuple[GraceRunner, list[str]]],
) -> None:
    runner, log = make_runner(max_output_sets=1)  # one graph, whatever earlier tests' threads left
    waiting = pools.waiting()
    w = torch.ones(())
    for _ in range(2):
        runner(w, torch.ones(2, 3), 1)
    (held,) = runner(w, torch.ones(2, 3), 1)
    view = held[:1]  # a view keeps the storage as well
    del held
    grace.runner.release_all()
    assert not runner.slots and "reset g0" not in log and pools.waiting() == waiting + 1
    del view
    assert pools.release_unheld() == 1 and log.count("reset g0") == 1 and pools.waiting() == waiting


def test_a_graph_serving_a_second_thread_counts_the_tensors_it_handed_out_before() -> None:
    """Note: [Outputs and threads]: two outputs view one buffer; the graph handed out its own tensors
    (uncountable) before a second thread came; from then on whoever holds them counts as a holder."""
    from grace.capture import HeldState

    base = torch.zeros(4, 4)
    outputs: list[Any] = [base[:2], base[0]]
    del base  # alive through the views, as an Inductor buffer whose views are the outputs
    graph = fakes.captured_graph(None, placeholders={}, outputs=outputs, output_container="tuple")
    del outputs
    graph.note_replay(1)  # this thread's call got the graph's own tensors
    handed = graph.outputs[0]
    assert _in_thread(lambda: graph.held_outputs(2)) == HeldState.HELD  # another thread: ``handed`` is held
    assert graph.threads_shared and graph.outputs[0] is not handed
    assert graph.outputs[0].data_ptr() == handed.data_ptr()
    del handed
    assert _in_thread(lambda: graph.held_outputs(3)) == HeldState.NONE
    out = graph.collect_outputs([], clone=False)  # aliases from now on
    assert out[0] is not graph.outputs[0]
    assert graph.held_outputs(4) == HeldState.HELD  # by anyone, this thread too
    del out
    assert graph.held_outputs(4) == HeldState.NONE


def test_a_threads_first_call_makes_the_primary_context_current_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread whose first CUDA work is a replay has no current context; the runner makes the device's
    primary context current before the driver calls, once per thread, and leaves a current one alone."""
    from grace.compat import cuda as cuda_compat

    calls: list[str] = []

    class FakeDriver:
        current = 0

        def cuCtxGetCurrent(self) -> tuple[int, int]:
            calls.append("get")
            return (0, self.current)

        def cuDeviceGet(self, index: int) -> tuple[int, int]:
            return (0, 100 + index)

        def cuDevicePrimaryCtxRetain(self, device: int) -> tuple[int, int]:
            return (0, 7000 + device)

        def cuCtxSetCurrent(self, context: int) -> tuple[int]:
            calls.append(f"set {context}")
            self.current = context
            return (0,)

    fake = FakeDriver()
    monkeypatch.setattr(cuda_compat, "driver", lambda: fake)

    def in_thread(index: int) -> None:
        cuda_compat.ensure_context_current(index)
        cuda_compat.ensure_context_current(index)  # the second time costs nothing

    worker = threading.Thread(target=in_thread, args=(1,))
    worker.start()
    worker.join()
    assert calls == ["get", "set 7101"]
    calls.clear()
    worker = threading.Thread(target=in_thread, args=(1,))  # a new thread asks again; a context is current
    worker.start()
    worker.join()
    assert calls == ["get"]


def test_pools_released_together_are_handed_back_to_the_device_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """grace.pools: the allocator's cache is emptied once after any number of releases, at the next
    ``release_unheld`` (the start of a call), not once per released pool, and not again after that."""
    from grace.compat import torch as torch_compat

    hand_backs: list[int] = []
    monkeypatch.setattr(torch_compat, "hand_back_cached_segments", lambda: hand_backs.append(1))
    pools.release_unheld()  # whatever earlier tests left due
    hand_backs.clear()
    released: list[str] = []
    for name in ("g0", "g1", "g2"):
        assert pools.release_when_unheld([], lambda name=name: released.append(name))
    assert released == ["g0", "g1", "g2"] and hand_backs == []
    pools.release_unheld()
    assert hand_backs == [1]
    pools.release_unheld()
    assert hand_backs == [1]


def test_resets_and_extra_runs_hand_cached_segments_back_and_a_capture_does_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note: [Hand back before a capture] (grace.pools): resetting any torch graph (a declined capture
    among them) and a check's no-graph run make the next call hand the cache back; a capture hands it
    back before it allocates its pool, whatever is due."""
    import grace.graph
    import grace.verify
    from grace.compat import torch as torch_compat

    events: list[str] = []
    monkeypatch.setattr(torch_compat, "hand_back_cached_segments", lambda: events.append("hand back"))
    pools.release_unheld()  # whatever earlier tests left due
    events.clear()

    class _Graph:
        def reset(self) -> None:
            events.append("reset")

    grace.graph._reset(_Graph())
    pools.release_unheld()
    pools.release_unheld()
    assert events == ["reset", "hand back"]
    events.clear()
    grace.verify._no_graph_run(lambda x: x + 1, [torch.ones(2)], None)
    pools.release_unheld()
    assert events == ["hand back"]
    events.clear()

    def no_graph(**_: Any) -> Any:
        events.append("new graph")
        raise RuntimeError("no device")

    monkeypatch.setattr(torch_compat, "new_cuda_graph", no_graph)
    with pytest.raises(grace.capture.CaptureError):
        grace.capture.capture_graph(
            lambda x: x,
            [torch.ones(2)],
            device=torch.device("cpu"),
            dynamic_indices=[0],
            static_indices=[],
            mutated_indices=[],
        )
    assert events == ["hand back", "new graph"]
