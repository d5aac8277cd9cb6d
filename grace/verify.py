"""Safety net for kept graph variants: compare a replay with the no-graph callable at a few calls.

Problem: the deciding call checks each variant once (grace.decide), but the output a steady call returns
comes from later replays, and a graph (with input copies or with parameter indirection) can go wrong
only when something about the call changes: inputs at new addresses, a pointer table rewritten, vendor
kernels patched on the device. A variant kept without timing (``scg=False``, or a mutating callable)
would otherwise never be compared with eager again.

Design: ``check_against_reference`` compares one replay of the graph variant with one run of the
no-graph callable on the same inputs, then asks the PI plan (when the variant has one) whether its
device-side updates succeeded. A callable without side effects runs the no-graph callable first, with its
output moved to host memory when large (grace.hostref), then the graph, whose outputs are compared in
place: no second device copy of the outputs is ever alive beside the graph's own (Note: [Deciding-call
memory], docs/design/runtime.md). A mutating callable runs the graph first, keeps a copy of what it produced
(outputs and mutated inputs, in host memory when large), restores the mutated inputs and runs the no-graph
callable. Each no-graph run starts and ends without a cuBLAS workspace (Note: [cuBLAS workspaces] in
grace.capture), and what it leaves cached goes back to the device at the next call (grace.pools).
The runner calls it on the deciding call's returned replay, on the first steady call, and on the first
call whose dynamic inputs sit at other addresses than at the decision: a handful of extra no-graph runs
per graph, none per steady call.

Invariants:
- the callable's side effects are applied exactly once: mutated inputs are restored before the
  reference run, which applies them again (and its result is what the caller sees on a mismatch);
- a callable that draws random numbers draws the same in both runs, and the call leaves the
  generators where one run leaves them: the second run starts from the states the first one found
  (grace.rerun);
- on a match the graph's own outputs are returned (still valid: the reference run allocates outside
  the graph's pool), so the caller keeps the graph variant's aliasing and lifetime rules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from grace import pools
from grace.capture import CapturedGraph
from grace.compat import torch as torch_compat
from grace.hostref import kept_copy, offload
from grace.rerun import CallStart
from grace.scg import MUTATED, outputs_match


def synchronize(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def graph_health(graph: CapturedGraph | None) -> str | None:
    """What the PI plan of ``graph`` reports after a completed replay (None when fine or no plan)."""
    plan = graph.pi_plan if graph is not None else None
    if plan is None:
        return None
    problem = plan.health()
    return str(problem) if problem else None


def check_against_reference(
    run_graph: Callable[[], Any],
    compiled: Callable[..., Any],
    args: Sequence[Any],
    mutated: Sequence[int],
    graph: CapturedGraph | None,
    device: torch.device | None,
    host_bytes: int = 0,
    random: bool = False,
    noise: Mapping[str, float] | None = None,
    undefined: Sequence[int] = (),
) -> tuple[Any, str | None, Any]:
    """(graph output, problem or None, no-graph output) for one call; see the module docstring.
    ``host_bytes``: the reference of a callable without side effects, and the copies a mutating
    callable's check keeps, go to host memory from this size on (``grace.hostref``; 0: never).
    ``random``: the callable draws random numbers; both runs start from the generators' states the call
    found (Note: the rule in grace.rerun). ``noise``: the run-to-run spread the slot's deciding call
    measured (Note: [Run-to-run noise] in grace.noise). ``undefined``: outputs no run defines, not
    compared (Note: [Random state of an op that draws nothing] in grace.philox)."""
    mutated = [i for i in mutated if isinstance(args[i], torch.Tensor)]
    start = CallStart(args, mutated, random, device, host_bytes)
    if not mutated:
        return _check_pure(run_graph, compiled, args, graph, device, host_bytes, start, noise, undefined)
    out = run_graph()
    # Only a mutating reference run can change what ``out`` shows (an output viewing a mutated input).
    got = kept_copy(out, host_bytes)
    got_state = kept_copy([args[i] for i in mutated], host_bytes)
    start.restore()
    reference = _no_graph_run(compiled, args, device)
    problem = outputs_match(reference, got, noise=noise, undefined=undefined)
    if problem is None:
        problem = outputs_match([args[i] for i in mutated], got_state, "mutated input", noise, MUTATED)
    if problem is None:
        problem = graph_health(graph)
    return out, problem, reference


def _check_pure(
    run_graph: Callable[[], Any],
    compiled: Callable[..., Any],
    args: Sequence[Any],
    graph: CapturedGraph | None,
    device: torch.device | None,
    host_bytes: int,
    start: CallStart,
    noise: Mapping[str, float] | None,
    undefined: Sequence[int],
) -> tuple[Any, str | None, Any]:
    """The check of a callable without side effects: the no-graph run first, its output moved to host
    memory when it reaches ``host_bytes`` (then the graph's outputs are never beside a second device copy),
    and compared with the replay's outputs in place. The replay starts from the generators' states the
    reference started from, so it draws the same numbers and leaves them where one run does."""
    reference, on_host = offload(_no_graph_run(compiled, args, device), host_bytes)
    start.restore()
    out = run_graph()
    synchronize(device)
    problem = outputs_match(reference, out, noise=noise, undefined=undefined) or graph_health(graph)
    if problem is not None and on_host:
        start.restore()
        reference = compiled(*args)  # what the caller gets instead of the replay: on the device
    return out, problem, reference


def _no_graph_run(compiled: Callable[..., Any], args: Sequence[Any], device: torch.device | None) -> Any:
    """One run of the no-graph callable that starts without a cuBLAS workspace, as a stream's first run
    does (one held from an earlier run would sit beside its cuDNN convolutions' transient workspaces), and
    leaves none behind: replays use the one in their graph's pool (Note: [cuBLAS workspaces])."""
    torch_compat.clear_cublas_workspaces()
    reference = compiled(*args)
    synchronize(device)
    torch_compat.clear_cublas_workspaces()
    pools.mark_hand_back_due()  # its blocks stay cached once it dies (Note: [Hand back before a capture])
    return reference
