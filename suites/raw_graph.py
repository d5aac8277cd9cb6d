"""The physical reference of the performance suite: the workload's kernels in a CUDA graph captured by
hand, replayed with nothing else around it.

Problem: a captured call under grace or PyTorch2-CG costs more than the graph's replay: Dynamo's frame
and guards, the backend's checks, input copies, output hand-out. How much more is the overhead those
layers add, and it needs a reference measured in the same run as the modes, on the same kernels.

Design: ``RawGraph`` wraps the Inductor-compiled callable (the kernels grace and PyTorch2-CG launch
too). Its first calls run that callable (compile, warm-up); the next one captures one call into a
``torch.cuda.CUDAGraph`` with ``torch.cuda.graph`` (its own pool, on the side stream that context
manager uses) and replays it from then on. Two modes use it (suites.modes): ``raw-graph`` replays on
the inputs it was captured on (the floor: one ``replay()``), ``raw-graph-copy`` captures on its own
copies of the tensor inputs and copies each call's inputs into them before the replay (what a graph
with static placeholders must do at the least). The performance suite times ``timed_call()``, the bare
replay, not the Python wrapper around it.

Invariants: a replay is never handed inputs it does not read: ``raw-graph`` refuses a call whose
tensor arguments are not the ones it was captured on (``timed_call``, which ``__call__`` goes through
too, checks identity); a callable that cannot be captured (a CPU op, a synchronisation)
raises ``ReferenceUnavailable``, recorded as a skip with its reason, never as a result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

WARMUP_CALLS = 2  # the first compiles, the second runs warm; the third captures


class ReferenceUnavailable(RuntimeError):
    """The workload's compiled call cannot be captured by hand (the reason is the message)."""


class RawGraph:
    def __init__(self, fn: Callable[..., Any], copy_inputs: bool) -> None:
        self.fn = fn
        self.copy_inputs = copy_inputs
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None
        self._captured: tuple[Any, ...] = ()  # the arguments the graph reads (its placeholders)
        self._pairs: list[tuple[int, torch.Tensor]] = []  # (argument index, placeholder) to copy into

    def __call__(self, *args: Any) -> Any:
        if self.graph is None:
            self.calls += 1
            if self.calls <= WARMUP_CALLS:
                return self.fn(*args)
            self._capture(args)
        self.timed_call(args)()
        return self.outputs

    def timed_call(self, args: Sequence[Any]) -> Callable[[], Any]:
        """What the suite times for a call with ``args``: the replay, and the copies of ``raw-graph-copy``."""
        graph = self.graph
        if graph is None:
            raise ReferenceUnavailable("the graph is captured on the third call; call it first")
        if not self.copy_inputs:
            if any(a is not c for a, c in zip(args, self._captured, strict=True)):
                raise ReferenceUnavailable("raw-graph replays on the inputs it was captured on only")
            return graph.replay
        pairs = [(placeholder, args[i]) for i, placeholder in self._pairs]

        def copy_and_replay() -> None:
            for placeholder, source in pairs:
                placeholder.copy_(source)
            graph.replay()

        return copy_and_replay

    def _capture(self, args: tuple[Any, ...]) -> None:
        captured = list(args)
        if self.copy_inputs:
            for i, a in enumerate(args):
                if isinstance(a, torch.Tensor) and a.is_cuda:
                    captured[i] = a.clone()
                    self._pairs.append((i, captured[i]))
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        try:
            with torch.cuda.graph(graph):
                outputs = self.fn(*captured)
        except Exception as exc:
            torch.cuda.synchronize()
            raise ReferenceUnavailable(f"capture by hand failed: {type(exc).__name__}: {exc}") from exc
        torch.cuda.synchronize()
        self.graph, self.outputs, self._captured = graph, outputs, tuple(captured)
