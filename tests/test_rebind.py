"""grace.rebind on CPU: which moves a graph can follow, the argument edits it makes, the family of graphs
sharing one pool and one set of outputs, and the runner's use of it. The driver calls (clone, edit,
instantiate) run in tests/test_rebind_gpu.py."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

import fakes
import pytest
import torch
from fakes import LoggedGraph

import grace.capture
import grace.decide
import grace.runner
import grace.slot
import grace.streams
from grace import stats
from grace.analysis import random_ops
from grace.capture import CapturedGraph, CaptureError, StorageSpan
from grace.cudagraph import KernelNode, KernelParam
from grace.decide import Rebound
from grace.options import GraceOptions
from grace.pi.scan import CopyNode
from grace.rebind import REBIND_ALIGNMENT, edits_for, moves
from grace.runner import GraceRunner, RunnerPlan
from grace.scg import Variant

MB = 1 << 20


def _span(start: int, nbytes: int = 4096, offset: int = 0) -> StorageSpan:
    return StorageSpan(start + offset, start, nbytes)


# --- which moves a graph can follow --------------------------------------------------------------


def test_moves_gives_the_distance_of_each_moved_input_only() -> None:
    old = {0: _span(1 * MB), 1: _span(2 * MB), 2: _span(3 * MB)}
    new = {0: _span(1 * MB), 1: _span(9 * MB), 2: _span(3 * MB - 4 * REBIND_ALIGNMENT)}
    assert moves(old, new, []) == {1: 7 * MB, 2: -4 * REBIND_ALIGNMENT}
    assert moves(old, dict(old), []) == {}


@pytest.mark.parametrize(
    ("new_span", "why"),
    [
        (_span(9 * MB, nbytes=8192), "storage has 8192 bytes"),
        (_span(9 * MB, offset=64), "another offset"),
        (_span(9 * MB + 16), "not a multiple of 256"),
    ],
)
def test_moves_declines_what_the_kernels_were_not_made_for(new_span: StorageSpan, why: str) -> None:
    result = moves({0: _span(1 * MB)}, {0: new_span}, [])
    assert isinstance(result, str) and why in result


def test_moves_declines_shared_storage_moving_apart_and_overlap_with_dynamic_inputs() -> None:
    shared = {0: _span(1 * MB, offset=0), 1: _span(1 * MB, offset=1024)}  # two views of one storage
    apart = {0: _span(5 * MB, offset=0), 1: _span(1 * MB, offset=1024)}
    result = moves(shared, apart, [])
    assert isinstance(result, str) and "share storage" in result
    together = {0: _span(5 * MB, offset=0), 1: _span(5 * MB, offset=1024)}
    assert moves(shared, together, []) == {0: 4 * MB, 1: 4 * MB}
    dynamic = [StorageSpan(8 * MB, 8 * MB, MB)]  # a captured input's storage the new span would overlap
    result = moves({0: _span(1 * MB)}, {0: _span(8 * MB + 4096)}, dynamic)
    assert isinstance(result, str) and "dynamic input" in result
    result = moves({0: _span(1 * MB)}, {}, [])
    assert isinstance(result, str) and "not tensors" in result


# --- the edits ------------------------------------------------------------------------------------


def _pointer(value: int) -> bytes:
    return struct.pack("<Q", value)


def _node(node: int, params: Sequence[bytes] = (), extra: bytes | None = None) -> KernelNode:
    offset, laid_out = 0, []
    for index, raw in enumerate(params):
        laid_out.append(KernelParam(index=index, offset=offset, size=len(raw), raw=raw))
        offset += len(raw)
    return KernelNode(node, 1, "k", (1, 1, 1), (1, 1, 1), 0, tuple(laid_out), extra)


def test_edits_move_every_address_in_a_moved_storage_and_nothing_else() -> None:
    old = {0: _span(1 * MB), 1: _span(2 * MB)}
    moved = {0: 16 * MB}  # input 1 did not move
    struct_arg = b"\x00" * 8 + _pointer(1 * MB + 512) + b"\x07" * 8  # an address inside a 24-byte struct
    nodes = [
        _node(10, [_pointer(1 * MB), _pointer(2 * MB), b"\x01\x00\x00\x00"]),  # plain pointer arguments
        _node(11, [struct_arg]),
        _node(12, extra=b"\x00" * 16 + _pointer(1 * MB + 8)),  # an argument buffer without a layout
        _node(13, [_pointer(5 * MB)]),  # reads nothing that moved
    ]
    edits = edits_for(nodes, [], {}, old, moved)
    assert not isinstance(edits, str)
    assert sorted(edits) == [10, 11, 12]
    (e10,) = edits[10]
    assert (e10.param_index, e10.param_offset, e10.byte_offset, e10.value) == (0, 0, 0, _pointer(17 * MB))
    (e11,) = edits[11]
    assert (e11.param_index, e11.param_offset, e11.byte_offset) == (0, 0, 8)
    assert e11.value == _pointer(17 * MB + 512)
    (e12,) = edits[12]
    assert (e12.param_index, e12.byte_offset, e12.value) == (None, 16, _pointer(17 * MB + 8))


def test_edits_decline_copies_and_nodes_that_may_hide_uses() -> None:
    old = {0: _span(1 * MB)}
    nodes = [_node(10, [_pointer(1 * MB)])]
    result = edits_for(nodes, [CopyNode(20, ((1 * MB, 1 * MB + 64),))], {}, old, {0: 4 * MB})
    assert isinstance(result, str) and "memcpy/memset" in result
    result = edits_for(nodes, [], {30: "host"}, old, {0: 4 * MB})
    assert isinstance(result, str) and "host" in result
    unreadable = KernelNode(40, 1, "k", (1, 1, 1), (1, 1, 1), 0, (KernelParam(0, 0, 8, b"\x00"),), None)
    result = edits_for([unreadable], [], {}, old, {0: 4 * MB})
    assert isinstance(result, str) and "could not be read" in result


# --- a family of graphs: one pool, one set of outputs ------------------------------------------------


def _captured(log: list[str], outputs: list[Any]) -> CapturedGraph:
    return fakes.captured_graph(
        LoggedGraph("origin", log), placeholders={}, outputs=outputs, output_container="single"
    )


def _rebound(origin: CapturedGraph, log: list[str], name: str) -> CapturedGraph:
    origin.sharers += 1
    return fakes.captured_graph(
        LoggedGraph(name, log),
        placeholders={},
        outputs=list(origin.outputs),
        output_container="single",
        device=origin.device,
        origin=origin,
    )


@pytest.mark.parametrize("origin_first", [True, False])
def test_the_pool_is_released_with_the_last_graph_of_the_family(origin_first: bool) -> None:
    log: list[str] = []
    origin = _captured(log, [torch.zeros(4)])
    first, second = _rebound(origin, log, "a"), _rebound(origin, log, "b")
    order = [origin, first, second] if origin_first else [first, second, origin]
    for graph in order[:-1]:
        graph.release()
        assert "reset origin" not in log  # the rebound graphs still replay in the origin's pool
    order[-1].release()
    assert log.count("reset origin") == 1 and {"reset a", "reset b"} <= set(log)
    assert origin.sharers == 0 and first.origin is None


def test_replays_of_a_family_on_another_stream_wait_for_the_last_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graphs of a family reuse one pool's intermediates: never two replays at once on two streams
    (Note: [Stream order] in grace.capture; tests/test_concurrency.py has the rule for a lone graph)."""
    log: list[str] = []

    class _Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_stream(self, other: _Stream) -> None:
            log.append(f"{self.name} waits for {other.name}")

    streams = {"now": _Stream("s1")}
    monkeypatch.setattr(grace.streams, "current_stream", lambda device: streams["now"])
    monkeypatch.setattr(grace.streams, "current_stream_key", lambda device: id(streams["now"]))
    origin = _captured(log, [torch.zeros(4)])
    other = _rebound(origin, log, "a")
    for graph in (origin, other):  # the same stream: in order already
        graph.run_with_copies([], clone=False)
    streams["now"] = _Stream("s2")
    other.run_with_copies([], clone=False)
    origin.run_with_copies([], clone=False)
    assert log == ["replay origin", "replay a", "s2 waits for s1", "replay a", "replay origin"]
    assert origin.last_stream is streams["now"] and other.last_stream is None  # kept by the family's origin


def test_graphs_sharing_outputs_are_one_graph_for_outputs_held_within_a_call() -> None:
    """Note: [Outputs held within one call]: layer 2's graph writes the outputs layer 1's graph handed out."""
    log: list[str] = []
    origin = _captured(log, [torch.zeros(4)])
    other = _rebound(origin, log, "a")
    assert other.outputs_owner is origin and other.output_bytes == 0
    origin.note_replay(7)
    assert other.would_overwrite_held_outputs(7)  # the same call: the origin's own tensors are out
    other.note_replay(8)
    assert origin.last_generation == 8 and not origin.would_overwrite_held_outputs(9)
    out = other.collect_outputs([], clone=False)  # aliases of the shared outputs from now on
    assert out is not origin.outputs[0] and out.data_ptr() == origin.outputs[0].data_ptr()
    assert origin.would_overwrite_held_outputs(8)  # ``out`` is held
    del out
    assert not origin.would_overwrite_held_outputs(8)


# --- the runner ------------------------------------------------------------------------------------


@pytest.fixture
def layered_runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[Layered]:
    """A runner whose deciding call captures a stand-in graph, and whose rebind succeeds while
    ``allow[0]`` is True (each graph computes ``x * w * 2`` with the weight it was made for into its
    output, which a rebound graph shares with its origin). The compiled call's generation is
    ``generation[0]``, or a new one per log line while that is None."""
    log: list[str] = []
    allow = [True]
    generation: list[int | None] = [None]

    class _Computes:
        def __init__(self, name: str, w: torch.Tensor, out: torch.Tensor, x: torch.Tensor) -> None:
            self.name, self.w, self.out, self.x = name, w, out, x

        def replay(self) -> None:
            log.append(f"replay {self.name}")
            self.out.copy_(self.x * self.w * 2)

        def reset(self) -> None:
            log.append(f"reset {self.name}")

    placeholder = torch.zeros(2, 3)

    def graph_for(args: Sequence[Any], name: str, origin: CapturedGraph | None) -> CapturedGraph:
        static_out = origin.outputs[0] if origin is not None else torch.zeros(2, 3)
        outputs: list[Any] = [static_out]
        return fakes.captured_graph(
            _Computes(name, args[0], static_out, placeholder),
            placeholders={1: placeholder},
            outputs=outputs,
            static_indices=(0,),
            static_ptrs=[args[0].data_ptr(), None, None],
            origin=origin,
        )

    def capture(facts: Any, args: Sequence[Any]) -> CapturedGraph:
        log.append("capture")
        return graph_for(args, f"c{len(log)}", None)

    def rebind_graph(facts: Any, graph: CapturedGraph, variant: Variant, args: Sequence[Any]) -> Rebound:
        if not allow[0]:
            return Rebound(None)
        origin = graph.origin or graph
        origin.sharers += 1
        log.append("rebind")
        return Rebound(graph_for(args, f"r{len(log)}", origin))

    fakes.use_decide(monkeypatch, fakes.decides_graph(capture))
    fakes.use_rebind(monkeypatch, rebind_graph)
    fakes.cpu_warmup(monkeypatch)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "the one stream")
    monkeypatch.setattr(
        grace.slot.torch_compat,
        "compiled_call_generation",
        lambda: len(log) if generation[0] is None else generation[0],
    )
    stats.forget_all()
    cpu = torch.device("cpu")
    plan = RunnerPlan("h", device=cpu, static_indices=(0,), dynamic_indices=(1,), scalar_indices=(2,))
    options = GraceOptions(check_numerics=False)
    yield GraceRunner(lambda w, x, n: [x * w * n], plan, options, None), log, allow, generation
    stats.forget_all()


Layered = tuple[GraceRunner, list[str], list[bool], list[int | None]]


def test_moved_parameters_are_followed_by_rebinding_without_a_capture(
    layered_runner: Layered,
) -> None:
    runner, log, _, _ = layered_runner
    layers = [torch.full((), float(k + 1)) for k in range(4)]
    x = torch.ones(2, 3)
    for w in [layers[0], layers[0], *layers[1:], *layers]:
        (out,) = runner(w, x, 2)
        torch.testing.assert_close(out, x * w * 2)
    assert log.count("capture") == 1 and log.count("rebind") == 3  # layers come back without either
    (record,) = stats.snapshot()
    assert (record["rebinds"], record["recaptures"], record["graphs_held"]) == (3, 0, 4)
    assert record["output_bytes_held"] == x.nbytes  # one set of outputs for the four graphs
    assert "static_input_moved" not in {s["code"] for s in record["skip_reasons"]}


def test_rebinds_and_captures_have_their_own_bounds(layered_runner: Layered) -> None:
    """A declined rebind captures again; rebinds stop at ``max_rebinds`` (moves are then captured) and
    captures at ``max_recaptures`` (the slot then runs without a graph)."""
    runner, log, allow, _ = layered_runner
    runner.options = runner.options.replace(max_rebinds=2, max_recaptures=2)
    layers = [torch.full((), float(k + 1)) for k in range(7)]
    x = torch.ones(2, 3)
    runner(layers[0], x, 2)
    runner(layers[0], x, 2)  # captured
    runner(layers[1], x, 2)  # rebound
    allow[0] = False
    runner(layers[2], x, 2)  # declined: captured
    allow[0] = True
    runner(layers[3], x, 2)  # rebound: the second, the last max_rebinds allows
    runner(layers[4], x, 2)  # captured: the second, the last max_recaptures allows
    assert log.count("rebind") == 2 and log.count("capture") == 3
    for k in range(5):  # every layer comes back to its own graph
        (out,) = runner(layers[k], x, 2)
        torch.testing.assert_close(out, x * layers[k] * 2)
    (record,) = stats.snapshot()
    assert (record["rebinds"], record["recaptures"], record["graphs_held"]) == (2, 2, 5)
    (out,) = runner(layers[5], x, 2)  # past both bounds
    torch.testing.assert_close(out, x * layers[5] * 2)
    (record,) = stats.snapshot()
    assert record["variant"] == "no_graph" and record["graphs_held"] == 0
    assert "too_many_recaptures" in {s["code"] for s in record["skip_reasons"]}


def test_rebind_off_captures_again(layered_runner: Layered) -> None:
    runner, log, _, _ = layered_runner
    runner.options = runner.options.replace(rebind=False)
    x = torch.ones(2, 3)
    for w in (torch.ones(()), torch.ones(()), torch.full((), 2.0)):
        runner(w, x, 2)
    assert log.count("rebind") == 0 and log.count("capture") == 2


def test_a_layer_finding_another_layers_outputs_held_gets_a_capture_of_its_own(
    layered_runner: Layered,
) -> None:
    """Note: [Layers that hold each other's outputs] (grace.rebind)."""
    runner, log, _, generation = layered_runner
    w0, w1, w2 = (torch.full((), float(k + 1)) for k in range(3))
    x = torch.ones(2, 3)
    generation[0] = 1
    runner(w0, x, 2)  # warm-up
    generation[0] = 2
    runner(w0, x, 2)  # captured
    (out,) = runner(w1, x, 2)  # rebound; the origin's own outputs were handed out: cannot count, no graph
    torch.testing.assert_close(out, x * w1 * 2)
    assert log.count("rebind") == 1 and log.count("capture") == 1
    generation[0] = 3
    (kept,) = runner(w0, x, 2)  # the origin hands out an alias, which the caller keeps
    (out,) = runner(w1, x, 2)  # counted: still held, so layer 1 gets a capture with outputs of its own
    torch.testing.assert_close(kept, x * w0 * 2)
    torch.testing.assert_close(out, x * w1 * 2)
    assert log.count("capture") == 2
    (record,) = stats.snapshot()
    assert (record["rebinds"], record["recaptures"], record["graphs_held"]) == (0, 1, 2)
    assert "rebind_declined" in {s["code"] for s in record["skip_reasons"]}
    runner(w2, x, 2)  # no more rebinds for this slot
    assert log.count("rebind") == 1 and log.count("capture") == 3


# --- random numbers ---------------------------------------------------------------------------------


def test_random_ops_are_found_in_the_fx_graph() -> None:
    def noisy(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)

    def plain(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) @ x.T

    def evaluated(x: torch.Tensor) -> torch.Tensor:  # nn.Dropout in eval mode passes training=False
        return torch.nn.functional.dropout(x, 0.5, False) + torch.dropout(x, 0.1, train=False)

    assert len(random_ops(torch.fx.symbolic_trace(noisy))) == 2
    assert random_ops(torch.fx.symbolic_trace(plain)) == ()
    assert random_ops(torch.fx.symbolic_trace(evaluated)) == ()


def test_an_output_that_is_an_input_of_the_call_is_found() -> None:
    from grace.capture import OutputAlias

    log: list[str] = []
    hidden, scores, viewed = torch.zeros(4), torch.zeros(8), torch.zeros(2)
    origin = _captured(log, [hidden, scores, viewed])
    origin.aliases = (OutputAlias(position=2, input_index=0, offset_delta=0),)
    assert origin.outputs_read_by((torch.ones(()), hidden[1:], 3), (1,))  # a view of it counts too
    assert not origin.outputs_read_by((hidden, torch.zeros(4), 3), (1,))  # only the dynamic inputs
    assert not origin.outputs_read_by((viewed,), (0,))  # a view of an input is not the pool's


def test_rebind_declines_a_graph_that_draws_random_numbers() -> None:
    from grace.rebind import rebind

    origin = _captured([], [torch.zeros(4)])
    with pytest.raises(CaptureError, match="random numbers"):
        rebind(origin, (), random_ops=("aten.rand_like.default",))
