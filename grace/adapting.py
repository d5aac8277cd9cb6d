"""The contract between grace's runtime and the input adapter CGCT puts in front of a graph.

Problem: CGCT moves work out of the captured region (CPU inputs copied to the GPU, mirrors of CPU
attributes refreshed) into an adapter the runtime applies to each call's inputs. The adapter may hand
the graph tensors it owns and reuses from call to call (a fixed device home for hoisted CPU inputs, so
that a graph sees the same addresses on every call); such a tensor must never reach the caller, who
would see it overwritten by the next call, where eager returns a fresh tensor each time.

Design: ``InputAdapting`` is what the runtime calls: ``adapter(inputs)`` before the compiled callable,
then ``adapter.returned(outputs)`` with what the call is about to hand back. An adapter that reuses
memory checks there, once per layout, whether an output lives in that memory, and if so stops reusing
it (later calls get fresh tensors, and the output already returned is never written again).

Invariants (kept by every caller of an adapter: ``GraceRunner`` and the backend's safe path):
- ``returned`` is called with the outputs of every call that completed, before they are handed back;
- one call's ``adapter(inputs)``, its compiled run and ``returned`` are not interleaved with another
  call's on the same adapter (the runner's lock, or the safe path's own).
"""

from __future__ import annotations

from typing import Any, Protocol


class InputAdapting(Protocol):
    def __call__(self, inputs: list[Any]) -> list[Any]:
        """The inputs the compiled callable takes, made from the caller's (a new list)."""
        ...

    def returned(self, outputs: Any) -> None:
        """The call that took the last adapted inputs is about to return ``outputs``."""
        ...
