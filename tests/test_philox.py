"""grace.philox on CPU: an attention op's Philox seeds found by schema name in forward and backward
graphs, left out of the analysis' device checks, handed to plain runs as host copies, and the only
outputs whose device may differ between a replay and a plain run (Note: [Philox seeds of attention]).

The graphs are traced with fake CUDA tensors (FakeTensorMode with device "cuda" works on a CPU-only
torch), so the ops are the real ATen overloads with their schemas."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from grace import philox
from grace.analysis import analyze_inputs
from grace.reasons import SkipCode
from grace.scg import devices_differ, output_devices, outputs_match

aten = torch.ops.aten


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.3)
    return out * 2, lse, seed, offset


def _attention_backward(*args: torch.Tensor) -> Any:
    grad, q, k, v, out, lse, seed, offset = args
    return aten._scaled_dot_product_efficient_attention_backward(
        grad, q, k, v, None, out, lse, seed, offset, 0.3, [True, True, True, False]
    )


def _qkv() -> list[torch.Tensor]:
    return [torch.empty(2, 4, 16, 32, device="cuda") for _ in range(3)]


def test_seed_outputs_and_inputs_are_found_by_schema_name() -> None:
    with FakeTensorMode():
        forward = make_fx(_attention)(*_qkv())
        q, k, v = _qkv()
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.3)
        backward = make_fx(_attention_backward)(out, q, k, v, out, lse, seed, offset)
    assert philox.seed_outputs(forward) == (2, 3)
    assert philox.seed_inputs(forward) == ()
    assert philox.seed_inputs(backward) == (6, 7)
    assert philox.seed_outputs(backward) == ()


def test_the_analysis_does_not_count_host_seeds_as_cpu_inputs() -> None:
    with FakeTensorMode():
        q, k, v = _qkv()
        out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.3)
        seed, offset = torch.empty((), dtype=torch.long), torch.empty((), dtype=torch.long)
        inputs = [out, q, k, v, out, lse, seed, offset]
        backward = make_fx(_attention_backward)(*inputs)
        with torch.no_grad():
            result = analyze_inputs(backward, inputs)
            assert result.skip is None, result.skip
            # Any other CPU input still declines the graph, and the reason names that input.
            inputs[1] = torch.empty(2, 4, 16, 32)
            other = analyze_inputs(backward, inputs)
    assert other.skip is not None and other.skip.code is SkipCode.CPU_INPUT
    assert other.skip.detail == "input arg1_1 is on cpu", other.skip.detail


def test_plain_runs_get_host_copies_of_device_seeds_only() -> None:
    seen: list[tuple[str, ...]] = []

    def graph(*args: Any) -> None:
        seen.append(tuple(a.device.type if isinstance(a, torch.Tensor) else "" for a in args))

    with FakeTensorMode():
        device_seed = torch.empty((), dtype=torch.long, device="cuda")
        rng_state = torch.empty(2, dtype=torch.long, device="cuda")  # flash attention's: stays
        other = torch.empty((), device="cuda")
        philox.host_seeds(graph, (0, 1))(device_seed, rng_state, other, 3)
    assert seen == [("cpu", "cuda", "cuda", "")]
    assert philox.host_seeds(graph, ()) is graph


def test_only_seed_outputs_may_change_device() -> None:
    with FakeTensorMode():
        cuda, cpu = torch.empty(1, device="cuda"), torch.empty(())
        plain = output_devices([cuda, 4, cpu])
        replay = output_devices([cuda, 4, cuda])
    assert plain == ("cuda", "", "cpu")
    assert devices_differ(replay, plain, free=(2,)) is None
    problem = devices_differ(replay, plain)
    assert problem is not None and "output 2" in problem
    assert devices_differ(replay[:2], plain) is not None


def test_a_backward_that_reads_its_seeds_on_the_device_gets_no_host_copies() -> None:
    """cuDNN attention's backward rejects host seeds ("philox_seed is on cpu", DistilGPT2 training
    with AMP on the H200): its seed arguments are no seed inputs; efficient attention's are."""
    graph = torch.fx.Graph()
    names = ["grad", "q", "k", "v", "out", "lse", "seed", "offset", "bias", "cum_q", "cum_k"]
    nodes = [graph.placeholder(n) for n in names]
    cudnn = aten._scaled_dot_product_cudnn_attention_backward.default
    result = graph.call_function(cudnn, (*nodes, 64, 64, 0.1, False))
    graph.output(result)
    assert philox.seed_inputs(torch.fx.GraphModule(torch.nn.Module(), graph)) == ()
    graph = torch.fx.Graph()
    nodes = [graph.placeholder(n) for n in names[:8]]
    efficient = aten._scaled_dot_product_efficient_attention_backward.default
    grad, q, k, v, out, lse, seed, offset = nodes
    args = (grad, q, k, v, None, out, lse, seed, offset, 0.3, [True, True, True, False])
    graph.output(graph.call_function(efficient, args))
    assert philox.seed_inputs(torch.fx.GraphModule(torch.nn.Module(), graph)) == (6, 7)


def _attention_without_dropout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0)
    flash = aten._scaled_dot_product_flash_attention(q, k, v, dropout_p=0.0)
    return out, lse, seed, offset, flash[6], flash[0]


def test_the_random_state_of_attention_without_dropout_is_undefined() -> None:
    """Note: [Random state of an op that draws nothing]: with ``dropout_p`` 0 the seeds (and flash
    attention's ``rng_state``) are undefined outputs; with dropout they are not."""
    with FakeTensorMode():
        without = make_fx(_attention_without_dropout)(*_qkv())
        with_dropout = make_fx(_attention)(*_qkv())
    assert philox.undefined_outputs(without) == (2, 3, 4)
    assert philox.seed_outputs(without) == (2, 3)
    assert philox.undefined_outputs(with_dropout) == ()


def test_a_symbolic_dropout_counts_as_drawing() -> None:
    graph = torch.fx.Graph()
    q, k, v, p = (graph.placeholder(n) for n in ("q", "k", "v", "p"))
    op = graph.call_function(aten._scaled_dot_product_efficient_attention.default, (q, k, v, None, True, p))
    graph.output(tuple(graph.call_function(operator.getitem, (op, i)) for i in range(4)))
    assert philox.undefined_outputs(torch.fx.GraphModule({}, graph)) == ()


def test_checks_leave_out_undefined_outputs_only() -> None:
    out = torch.arange(4.0)
    reference = [out, torch.tensor(7), torch.tensor(1)]
    replay = [out.clone(), torch.tensor(-3), torch.tensor(1)]
    problem = outputs_match(reference, replay)
    assert problem is not None and "output[1]" in problem
    assert outputs_match(reference, replay, undefined=(1,)) is None
    replay[2] = torch.tensor(2)
    problem = outputs_match(reference, replay, undefined=(1,))
    assert problem is not None and "output[2]" in problem
