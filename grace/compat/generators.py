"""The default random generators' states: saved before grace's extra runs of a call, restored before each.

Problem: a callable that draws random numbers advances the CPU generator and its device's CUDA
generator on every run. grace runs a call's graph more than once while deciding and verifying (the
no-graph reference, numeric checks, SCG samples), so without care each extra run consumes numbers that
the caller's next call would have drawn.

Design: ``save_generators`` reads the CPU generator's state and, for a CUDA device, that device's default
generator (seed and Philox offset); ``restore_generators`` writes them back in place. A CUDA graph that
draws random numbers reads the generator's seed and offset when it is replayed and advances the offset
by what its capture consumed, so a replay after a restore draws what a no-graph run would have drawn and
leaves the generator where that run leaves it. ``reads_seeds_on_device`` names the attention backwards
that take their Philox seeds as device tensors in a plain run too (grace.philox copies the others' to
the host outside a capture).

Invariant: restoring never happens while a stream captures (torch refuses it there), and only the
default generators are covered: a graph is given no other generator by Dynamo.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GeneratorStates:
    """The CPU generator's state and, on a CUDA device, that device's generator state."""

    cpu: torch.Tensor
    device: torch.device | None
    cuda: torch.Tensor | None


def save_generators(device: torch.device | None) -> GeneratorStates:
    """The states of the default generators that a run on ``device`` draws from; raises when a state
    cannot be read (the caller then declines graphs of random callables)."""
    cuda = None
    if device is not None and device.type == "cuda":
        cuda = torch.cuda.get_rng_state(device)
    return GeneratorStates(torch.get_rng_state(), device, cuda)


def restore_generators(states: GeneratorStates) -> None:
    """Write ``states`` back into the default generators."""
    torch.set_rng_state(states.cpu)
    if states.cuda is not None and states.device is not None:
        torch.cuda.set_rng_state(states.cuda, states.device)


# Attention backwards that read their Philox seed and offset as device tensors in a plain run too (torch
# 2.11: cuDNN's, which rejects host seeds); the others dereference 0-dimensional seeds on the host
# outside a capture (grace.philox).
_DEVICE_SEED_READERS = frozenset({"aten::_scaled_dot_product_cudnn_attention_backward"})


def reads_seeds_on_device(op_name: str) -> bool:
    """Whether the op named ``op_name`` (its schema name) takes its Philox seeds on the device always."""
    return op_name in _DEVICE_SEED_READERS
