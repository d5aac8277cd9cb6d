"""Inputs handed over as one list the callee empties: a backward run without a graph frees its saved
tensors as it goes, as Inductor's own entry does.

Problem: AOTAutograd calls a training graph with one list of inputs and lets the callee take it
(``steal_args``): Inductor's code empties the list and drops each input after its last read, so a
backward's temporaries and gradients reuse the memory of the saved tensors it has finished with. A
runner called with ``*args`` holds every input in a tuple for the whole call, so a backward that runs
without a graph (its slot declined one, or the gradients of its last replay are still held, as in
gradient accumulation) kept all its saved tensors until it returned: its peak was their size above
Inductor's alone.

Design: the installed entry (grace.training) moves AOTAutograd's list into an ``Inputs`` (a list the
callee may empty) and hands it down the guard and the runner as their ``args``. Only a run of the
compiled callable itself consumes it: ``run(fn, args)`` calls ``fn.call_list(args)`` where ``args`` is
an ``Inputs`` and ``fn`` a ``TakesList`` (``Consuming``, Inductor's entry; the philox and counting
wrappers pass the list on), and ``fn(*args)`` otherwise. The runner calls ``run`` only on its paths
that end with that run (no graph, outputs held); every other path (graphs, the deciding call, checks,
warm-up on a side stream, adapters) calls the compiled callable with positional inputs, which makes a
list of its own, so the ``Inputs`` stay whole for what it reads afterwards.

Invariants: an ``Inputs`` is emptied only by the compiled callable it was handed to, and nothing reads
it after that run; the guard does not rerun a call whose ``Inputs`` were emptied (grace.guard); a
tuple or plain list of inputs is never emptied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class Inputs(list[Any]):
    """The inputs of one call, which the compiled callable it reaches may empty (module docstring)."""

    __slots__ = ()


class TakesList:
    """A callable of positional inputs that can also take them as an ``Inputs`` and empty it."""

    __slots__ = ()

    def __call__(self, *args: Any) -> Any:
        raise NotImplementedError

    def call_list(self, inputs: Inputs) -> Any:
        raise NotImplementedError


class Consuming(TakesList):
    """``fn``, a callable that takes one list of inputs and empties it (Inductor's entry), called either
    way: with positional inputs it gets a list of its own, with ``call_list`` the caller's."""

    __slots__ = ("__wrapped__", "fn")

    def __init__(self, fn: Callable[[list[Any]], Any]) -> None:
        self.fn = fn
        self.__wrapped__ = fn  # where grace.compat.torch finds Inductor's module

    def __call__(self, *args: Any) -> Any:
        return self.fn(list(args))

    def call_list(self, inputs: Inputs) -> Any:
        return self.fn(inputs)


class RunsInputs(Protocol):
    """What the installed entry calls: a runner taking the call's inputs as one sequence."""

    def run(self, args: Sequence[Any]) -> Any: ...


def run(fn: Callable[..., Any], args: Sequence[Any]) -> Any:
    """``fn`` on ``args``, handing the list over where ``args`` is an ``Inputs`` and ``fn`` takes one."""
    if type(args) is Inputs and isinstance(fn, TakesList):
        return fn.call_list(args)
    return fn(*args)
