"""The tensor-parallel group and the collectives the TP workloads use.

Problem: a row-parallel layer's output is a partial sum that an all-reduce over the TP group completes.
For the compiled modes to see the whole forward as one graph, that all-reduce must be an op Dynamo traces
(a functional collective), not a call it breaks the graph on (``torch.distributed.all_reduce`` mutates
its argument and returns a work handle). Before any mode runs, every rank must also hold exactly rank 0's
weights and inputs, or TP outputs would differ from the reference for reasons that are not TP's.

Design: ``all_reduce_sum`` is the one place that calls the functional collectives (and so the one place
to adapt when their private API changes); ``TPGroup`` carries rank, world size and the process group, or
no group at all for a *simulated* rank (tests compute each rank's partial output in one process and sum
the partials themselves). ``broadcast_from_rank0`` copies rank 0's tensors to every rank with plain eager
``torch.distributed.broadcast`` (never traced).

Invariant: ``all_reduce_sum`` returns a plain, completed tensor in eager and under Dynamo alike, so no
collective is left unwaited and eager and compiled modes return the same kind of tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TPGroup:
    """This rank's place in the tensor-parallel group.

    ``group`` is the ``torch.distributed`` process group the row-parallel layers all-reduce over; None
    makes a simulated rank whose row-parallel layers return their partial sums unreduced (tests sum them).
    """

    rank: int
    world_size: int
    group: Any = None

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} of world size {self.world_size} is not a TP rank")

    @classmethod
    def single(cls) -> TPGroup:
        """World size 1 without communication: the TP model is the reference model, re-laid out."""
        return cls(rank=0, world_size=1, group=None)


def all_reduce_sum(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """``tensor`` summed over ``group``, waited for, traceable by Dynamo into the surrounding graph.

    torch 2.13 (read in torch/distributed/_functional_collectives.py): ``all_reduce(self, reduceOp,
    group, tag="")`` issues ``torch.ops._c10d_functional.all_reduce``; in eager it returns an
    ``AsyncCollectiveTensor`` that waits on first use, under Dynamo a plain tensor on which its
    ``wait_tensor`` is already called (so the graph holds one all_reduce and one wait_tensor). Waiting
    here in eager makes both a plain, completed tensor. The module is private API: a signature change on
    another torch is adapted here only.
    """
    from torch.distributed import _functional_collectives as funcol

    reduced = funcol.all_reduce(tensor, "sum", group)
    if isinstance(reduced, funcol.AsyncCollectiveTensor):  # eager only: Dynamo sees a plain tensor
        return funcol.wait_tensor(reduced)
    return reduced


def broadcast_from_rank0(tensors: Iterable[torch.Tensor], group: Any) -> None:
    """Overwrite every tensor in place with rank 0's values (eager ``torch.distributed.broadcast``).

    All ranks must pass tensors of the same shapes in the same order. Rank 0 of ``group`` is the source.
    """
    import torch.distributed as dist

    source = dist.get_global_rank(group, 0) if group is not None else 0
    for tensor in tensors:
        dist.broadcast(tensor.data, src=source, group=group)


def broadcast_module_from_rank0(module: torch.nn.Module, group: Any) -> None:
    """Make every parameter and buffer of ``module`` equal to rank 0's (same architecture on all ranks)."""
    broadcast_from_rank0([*module.parameters(), *module.buffers()], group)
