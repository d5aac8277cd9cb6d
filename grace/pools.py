"""Memory pools of released graphs whose outputs the caller still holds.

Problem: a graph's outputs live in its private memory pool. A graph is released while the caller may
still hold outputs of its last replay: the runner evicts the least recently used signature past
``max_graphs_per_callable``, a slot falls back to no graph, a family of rebound graphs loses its last
member, ``grace.reset()`` releases everything. Resetting the torch graph then hands the pool back to the
allocator, and memory the caller still reads may serve the next graph or tensor.

Design: ``CapturedGraph.release`` first drops every tensor of its own (outputs, placeholders), then
passes weak references to its outputs' storages and the pool's release (reset the torch graph, destroy
the pristine copy) to ``release_when_unheld``. With nothing of the outputs alive any more (every
storage's use count is zero: no tensor, view or alias of them, and no Python storage object, is left),
the pool is released at once; otherwise it waits here. ``release_unheld`` releases the waiting pools
whose outputs have all been dropped since, then hands the segments of every pool released since it last
ran back to the device, with one ``hand_back_cached_segments`` however many there were: resetting a
graph only marks its pool freeable, and until the allocator's cache is emptied the pool would stay
reserved beside every later graph's. The runner calls it at the start of every call (two checks when
nothing waits and nothing was released) and ``grace.reset()`` and eviction of callables after
releasing. Every reset of a torch graph (a failed or declined capture too, grace.graph ``_reset``) and
the end of every deciding call (whose reference, check and timing runs leave blocks cached in the
default pool) mark the hand-back as due (``mark_hand_back_due``).

Note: [Hand back before a capture] A capture allocates in a private pool, which cannot take memory the
caching allocator holds cached for another pool: what a deciding call's no-graph runs and a declined
capture left cached would stay reserved beside the new pool, and the device footprint of a training
step's deciding calls would be the sum of them all. So ``hand_back_before_capture`` returns every
unused cached segment to the device right before each capture (once per capture, under
``capture_lock``), and the capture's pool takes that memory.

Invariants:
- a pool is released only once every storage its outputs had is dead, so no memory a caller can still
  read is ever reused by another graph or tensor;
- each pool is released exactly once (the caller guards against releasing a graph twice);
- the registry holds no tensor: only weak references, so waiting never keeps an output alive;
- a pool is never released while another thread captures (``grace.compat.torch.capture_lock``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grace.compat import torch as torch_compat


@dataclass(frozen=True, eq=False)
class _WaitingPool:
    """A released graph's pool and the weak references to its outputs' storages."""

    storages: tuple[Any, ...]
    release: Callable[[], None]

    def held(self) -> bool:
        return any(torch_compat.storage_use_count(ref) > 0 for ref in self.storages)


_waiting: list[_WaitingPool] = []
_lock = threading.Lock()
_hand_back_due = False  # a pool was released since the allocator's cache was last emptied


def release_when_unheld(storages: Sequence[Any], release: Callable[[], None]) -> bool:
    """Run ``release`` now when no storage in ``storages`` (weak references) is alive, else once the
    last of them has been dropped (``release_unheld``). True when released now."""
    global _hand_back_due
    entry = _WaitingPool(tuple(storages), release)
    if not entry.held():
        with torch_compat.capture_lock:  # never while another thread captures (grace.capture)
            release()
        _hand_back_due = True
        return True
    with _lock:
        _waiting.append(entry)
    return False


def mark_hand_back_due() -> None:
    """A graph was reset or a deciding call ended: hand cached segments back at the next chance."""
    global _hand_back_due
    _hand_back_due = True


def hand_back_before_capture() -> None:
    """Note: [Hand back before a capture]; never while another thread captures."""
    global _hand_back_due
    with torch_compat.capture_lock:
        _hand_back_due = False
        torch_compat.hand_back_cached_segments()


def release_unheld() -> int:
    """Release every waiting pool whose outputs are no longer held, then hand the segments of every
    pool released since the last time back to the device, once; returns how many pools it released."""
    global _hand_back_due
    if not _waiting and not _hand_back_due:
        return 0
    with _lock:
        done: list[_WaitingPool] = []
        still: list[_WaitingPool] = []
        for entry in _waiting:
            (still if entry.held() else done).append(entry)
        _waiting[:] = still
    if not done and not _hand_back_due:
        return 0
    with torch_compat.capture_lock:
        for entry in done:
            entry.release()
        _hand_back_due = False
        torch_compat.hand_back_cached_segments()
    return len(done)


def waiting() -> int:
    """How many released graphs' pools wait for their held outputs to be dropped."""
    return len(_waiting)
