"""One training iteration in one mode (``TrainStep``), and the trace the correctness suite compares.

Problem: a training workload (suites.workloads.training) must run, be checked and be timed in every
mode with the machinery inference uses: the harness compiles and warms a callable per mode, the
performance suite times ``fn(*inputs)`` and profiles one call. So one call of a ``TrainStep`` is one
iteration: the mode's compiled forward (``suites.modes.build`` of the loss-returning model), the
loss's ``backward()``, an eager optimizer step and ``zero_grad(set_to_none=True)``.

Design:
- A ``TrainStep`` owns its model copy (switched to train mode: dropout on), its optimizer and its step
  count. Adam's ``capturable`` is on where the mode replays CUDA graphs on a CUDA device.
- Dropout is made comparable, not switched off: before every step the global generator is seeded with
  ``TRAIN_SEED + step``, and the forward runs with Inductor's ``fallback_random`` (random ops call ATen
  as eager does, as PyTorch's own benchmark harness does for training accuracy). Every mode then draws
  the same masks and leaves the generator where eager leaves it. Timings therefore include ATen's
  random kernels in compiled modes, as eager pays them.
- Mixed precision (``TrainingModel.autocast``): the forward runs under ``torch.autocast``; backward
  and the optimizer step are outside it, as in PyTorch's recipe (bfloat16 needs no gradient scaler).
  A float64 copy is not cast by autocast, so the float64 reference is the same for every precision.
- Phases are marked with profiler ranges (``PHASES``), so a profile of one call splits its kernels into
  forward, backward and optimizer (suites.launches ``phases_from_trace``).
- ``restore`` puts back a parameter state in place (same tensors: graphs that hold their addresses stay
  valid) and starts a fresh optimizer, so a warmed-up step can replay three steps from the initial state.
- ``run_trace`` runs steps and keeps what the correctness suite compares: each step's loss, the
  gradients of the last step before its ``zero_grad``, the parameters after it.

Invariant: a ``TrainStep`` enables autograd itself (the suites call it under ``no_grad``) and never
touches the module it was given by the caller except to train it: callers pass a deep copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from suites.modes import SPECS, Mode, build
from suites.tensors import Leaves
from suites.workloads.registry import Tag, Workload
from suites.workloads.training import TrainingModel

TRAIN_SEED = 1234
CHECK_STEPS = 3
FORWARD, BACKWARD, OPTIMIZER = "train.forward", "train.backward", "train.optimizer"
PHASES = (FORWARD, BACKWARD, OPTIMIZER)


def is_training(workload: Workload) -> bool:
    return Tag.TRAINING in workload.tags


@contextlib.contextmanager
def comparable_random() -> Iterator[None]:
    """Random ops in compiled code call ATen, as eager's do (same masks from the same seed)."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(fallback_random=True):
        yield


class TrainStep:
    """``step(*inputs) -> loss``: one training iteration of its own model in ``mode``."""

    def __init__(self, mode: Mode, model: TrainingModel, device_type: str) -> None:
        if not isinstance(model, TrainingModel):
            raise TypeError(
                f"a training workload's model must be a TrainingModel, not {type(model).__name__}"
            )
        self.mode = mode
        self.device_type = device_type
        self.model = model.train()
        self.spec = model.optimizer_spec
        self.capturable = SPECS[mode].uses_graphs and device_type == "cuda"
        self.forward = build(mode, self.model)
        self.optimizer = self.spec.make(self.model.parameters(), capturable=self.capturable)
        self.steps = 0
        self.keep_grads = False
        self.grads: Leaves = []

    def __call__(self, *inputs: Any) -> torch.Tensor:
        torch.manual_seed(TRAIN_SEED + self.steps)
        if SPECS[self.mode].uses_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.enable_grad(), comparable_random():
            with torch.profiler.record_function(FORWARD), self._autocast():
                loss = self.forward(*inputs)
            with torch.profiler.record_function(BACKWARD):
                loss.backward()
            if self.keep_grads:
                self.grads = gradients(self.model)
            with torch.profiler.record_function(OPTIMIZER):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return loss.detach()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.model.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=getattr(torch, self.model.autocast))

    def restore(self, state: Mapping[str, torch.Tensor]) -> None:
        """Parameters and buffers back to ``state`` (in place), a fresh optimizer, step count 0."""
        with torch.no_grad():
            for name, tensor in (*self.model.named_parameters(), *self.model.named_buffers()):
                tensor.copy_(state[name])
        self.optimizer = self.spec.make(self.model.parameters(), capturable=self.capturable)
        self.steps = 0
        self.grads = []

    def details(self) -> dict[str, Any]:
        return {
            "optimizer": self.spec.to_dict(),
            "capturable": self.capturable,
            "set_to_none": True,
            **({"autocast": self.model.autocast} if self.model.autocast else {}),
        }


def initial_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every parameter and buffer, by name (what ``TrainStep.restore`` puts back)."""
    return {name: t.detach().clone() for name, t in (*model.named_parameters(), *model.named_buffers())}


def gradients(model: torch.nn.Module) -> Leaves:
    return [(f"grad.{n}", p.grad.detach().clone()) for n, p in model.named_parameters() if p.grad is not None]


def parameters(model: torch.nn.Module) -> Leaves:
    return [(f"param.{n}", p.detach().clone()) for n, p in model.named_parameters()]


@dataclass(frozen=True)
class TrainTrace:
    """What ``CHECK_STEPS`` steps produced: losses per step, last step's gradients, final parameters."""

    loss: Leaves
    grad: Leaves
    param: Leaves

    def quantities(self) -> dict[str, Leaves]:
        return {"loss": self.loss, "grad": self.grad, "param": self.param}


def run_trace(step: TrainStep, inputs: tuple[Any, ...], steps: int = CHECK_STEPS) -> TrainTrace:
    """Run ``steps`` steps from ``step``'s current state, keeping the figures to compare."""
    losses: Leaves = []
    for index in range(steps):
        step.keep_grads = index == steps - 1
        try:
            loss = step(*inputs)
            losses.append((f"loss.step{index + 1}", loss.clone()))
        finally:
            step.keep_grads = False
    return TrainTrace(loss=losses, grad=step.grads, param=parameters(step.model))
