"""Diagnostic: the device memory of each deciding call, stage by stage (``train_memory.py --decide-memory``).

A training step's first steps peak above pt2cg's recording (docs/design/training.md, the deciding step);
this says which stage of which slot's deciding call sets that peak. ``install()`` wraps, for the rest of
the process, a slot's deciding call (``GraphSlot.decide``) and the stages of ``grace.decide.decide`` it
runs: the no-graph reference (``_reference_first``), the captures (``_capture_variants``) and the choice
(``grace.choice.choose_variant``: SCG's timing). After each stage it synchronises and records the bytes
allocated and the running peak (``max_memory_allocated``, which the caller's phase meter resets at its
own marks), both in MiB above ``BASE``, so a peak that grows within a stage is that stage's, beside the
bytes of the call's device inputs (a backward's saved tensors, held through every stage). Each event
carries ``STEP``, which the caller sets before each training step; ``events()`` returns them, then
forgets them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

import grace.choice
import grace.decide
import grace.slot

MIB = 1 << 20
STEP = 0
BASE = 0  # bytes allocated when the caller's memory window opened
_events: list[dict[str, Any]] = []
_current: list[dict[str, Any]] = []  # the deciding calls in progress, innermost last


def _mark(stage: str) -> None:
    if not _current:
        return
    torch.cuda.synchronize()
    _current[-1]["stages"].append(
        {
            "stage": stage,
            "allocated_mib": round((torch.cuda.memory_allocated() - BASE) / MIB, 1),
            "peak_mib": round((torch.cuda.max_memory_allocated() - BASE) / MIB, 1),
        }
    )


def _after(stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def marked(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            _mark(stage)

    return marked


def _cuda_tensors(args: Any) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor) and a.is_cuda]


def install() -> None:
    decide = grace.slot.GraphSlot.decide

    @functools.wraps(decide)
    def measured_decide(self: Any, args: Any, pool_group: Any = None) -> Any:
        role = getattr(getattr(self.runner.plan, "role", None), "value", None)
        storages = {a.untyped_storage().data_ptr(): a.untyped_storage().nbytes() for a in _cuda_tensors(args)}
        held = sum(storages.values())
        _current.append(
            {
                "event": "decide",
                "step": STEP,
                "graph_id": self.record.graph_id,
                "role": role,
                "inputs_mib": round(held / MIB, 1),  # what the call holds through its runs
                "stages": [],
            }
        )
        _mark("start")
        try:
            return decide(self, args, pool_group)
        finally:
            _mark("end")
            _events.append(_current.pop())

    grace.slot.GraphSlot.decide = measured_decide  # type: ignore[method-assign]
    grace.decide._reference_first = _after("reference", grace.decide._reference_first)  # type: ignore[attr-defined]
    grace.decide._capture_variants = _after("captures", grace.decide._capture_variants)  # type: ignore[attr-defined]
    grace.choice.choose_variant = _after("choice", grace.choice.choose_variant)  # type: ignore[assignment]


def events() -> list[dict[str, Any]]:
    out = list(_events)
    _events.clear()
    return out
