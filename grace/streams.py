"""grace's side streams and the order of a graph's runs across streams and threads.

Problem: warm-ups and captures run on a stream of grace's own (a capture takes in whatever is queued on
its stream), and a replay on one stream must not overtake work on another stream that still reads the
previous replay's outputs or the pool's intermediates.

Design: one side stream per device, used under one lock across runners and threads (Note: [One side
stream]); ``current_stream``, ``current_stream_key`` and ``synchronize_device`` are what a graph uses to
order its runs (Note: [Stream order]); ``calling_threads`` notes whether calls came from several
threads (Note: [Outputs and threads] in grace.outputs).

Note: [Stream order]
A replay reads its placeholders and pointer table and writes its pool (intermediates and outputs) on the
caller's current stream. Work the user queued on another stream after the previous call may still read
that call's outputs (or, for a graph of a family, grace.rebind, the pool's intermediates are another
graph's in flight). So every run through ``run_with_copies``/``run_with_pi`` first makes the current
stream wait for everything queued so far on the stream of the previous run of the graph or of its family
(``torch.cuda.Stream.wait_stream``: an event recorded on that stream now); since the user may also
have read the outputs on a third stream that grace never saw, a change of stream also waits for the
device to finish everything queued so far (one synchronisation per change; a call on the stream of the
previous one waits for nothing). This comes before the input copies, the table update and the replay;
copies back into mutated inputs and output clones follow on the current stream. The stream is kept with
the family's captured graph (``outputs_owner.last_stream``). A read on a third stream followed by a call
on the previous call's own stream is the caller's to order (``wait_stream``), as for any tensor that two
streams use. The runner's lock (grace.runner) makes the host side of two calls never overlap,
so the stream recorded is the one of the call queued last.

Invariant: each runner's own lock is taken first, the side-stream lock second, never the other way round.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from grace.compat import torch as torch_compat


class CallingThreads:
    """Whether calls of grace's runners have come from more than one thread since the last reset (Note:
    [Outputs and threads]): Dynamo's call count then moves with every thread's calls."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.several = False

    def note(self) -> None:
        if self.several:
            return
        ident = threading.get_ident()
        if self.first is None:
            self.first = ident
        elif ident != self.first:
            self.several = True

    def forget(self) -> None:
        self.first, self.several = None, False


calling_threads = CallingThreads()

_side_streams: dict[int, torch.cuda.Stream] = {}
# Note: [One side stream]: warm-ups and captures of every runner share grace's side stream, and a stream
# that captures takes in whatever any thread queues on it; so they run one at a time, across runners and
# threads, and no thread clears cuBLAS's workspaces during a capture (each runner's own lock is taken
# first, this one second, never the other way round).
_side_stream_lock = torch_compat.capture_lock


def current_stream(device: torch.device) -> Any:
    """The stream a run on ``device`` is queued on now (None for a device without streams)."""
    if device.type != "cuda":
        return None
    return torch.cuda.current_stream(device)


def synchronize_device(device: torch.device) -> None:
    """Wait until ``device`` has finished everything queued so far, on every stream."""
    if device.type == "cuda" and torch_compat.cuda_available():
        torch.cuda.synchronize(device)


def current_stream_key(device: torch.device) -> int | None:
    """The handle of ``current_stream(device)``, cheaper to get (None for a device without streams)."""
    if device.type != "cuda":
        return None
    return torch_compat.current_raw_stream(device)


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """grace's capture stream for ``device`` (one per device, created on first use)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _side_streams.get(index)
    if stream is None:
        stream = torch.cuda.Stream(device=index)
        _side_streams[index] = stream
    return stream


def run_on_side_stream(fn: Callable[..., Any], args: Sequence[Any], device: torch.device) -> Any:
    """Run ``fn(*args)`` on grace's side stream, ordered after and before the current stream's work.

    The warm-up call runs here, on the stream that captures; the cuBLAS workspace it allocated for that
    stream is dropped afterwards (Note: [cuBLAS workspaces] in grace.capture), so the no-graph runs that
    follow on the caller's stream reuse its memory instead of holding a second one beside it.
    """
    with _side_stream_lock:  # Note: [One side stream]
        stream = side_stream(device)
        current = torch.cuda.current_stream(device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            out = fn(*args)
        current.wait_stream(stream)
        torch_compat.clear_cublas_workspaces()
    return out
