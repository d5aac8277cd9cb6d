"""A one-pointer Triton kernel compiled by ``grace.compat.triton`` to probe how this Triton shapes a
kernel entry (how many parameters it appends). Imported lazily: importing it imports Triton."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grace_scratch_probe(x_ptr):  # type: ignore[no-untyped-def]
    tl.store(x_ptr + tl.arange(0, 32), tl.zeros([32], dtype=tl.float32))
