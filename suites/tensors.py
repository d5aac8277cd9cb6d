"""Tensor plumbing shared by the suites: flatten outputs, clone and move inputs, cast to float64.

Problem: models return tensors, tuples, dicts, HF ``ModelOutput``s and lists of dicts (detection); the
correctness suite compares them leaf by leaf, the performance suite needs fresh storage for every mode,
and the parameter-indirection check needs the same shapes at new addresses with new values.

Design: ``flatten`` turns any output into ``[(path, tensor)]`` with stable, readable paths ("logits",
"0.boxes"); everything else works on that list or maps over nested inputs with ``map_tensors``.

Invariants: ``clone_inputs`` and ``variant_inputs`` never share storage with their argument (so a
graph that kept a stale pointer is caught); ``variant_inputs`` keeps dtypes, shapes, devices and the
valid range of integer inputs (indices stay indices: integer and boolean tensors keep their values).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

Leaves = list[tuple[str, torch.Tensor]]


def flatten(value: Any, prefix: str = "") -> Leaves:
    """Every tensor (and number) in ``value`` with its path; ``None`` and unknown objects are dropped."""
    out: Leaves = []

    def walk(obj: Any, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            out.append((path or "out", obj))
        elif isinstance(obj, bool | int | float):
            out.append((path or "out", torch.tensor(obj)))
        elif isinstance(obj, Mapping):  # includes HF ModelOutput (an OrderedDict)
            for key, item in obj.items():
                walk(item, f"{path}.{key}" if path else str(key))
        elif isinstance(obj, list | tuple):
            for index, item in enumerate(obj):
                walk(item, f"{path}.{index}" if path else str(index))
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            for f in dataclasses.fields(obj):
                walk(getattr(obj, f.name), f"{path}.{f.name}" if path else f.name)

    walk(value, prefix)
    return out


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` with every tensor replaced by ``fn(tensor)``; containers are rebuilt, others kept."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return type(value)((k, map_tensors(v, fn)) for k, v in value.items())
    if isinstance(value, list):
        return [map_tensors(v, fn) for v in value]
    if isinstance(value, tuple):
        items = [map_tensors(v, fn) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def snapshot(value: Any) -> Leaves:
    """``flatten`` with every tensor detached and cloned: safe against later in-place writes and
    against graph runners that overwrite their outputs on the next replay."""
    return [(path, t.detach().clone()) for path, t in flatten(value)]


def clone_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """Same values, new storage (CPU tensors stay on the CPU)."""
    return tuple(map_tensors(x, lambda t: t.detach().clone()) for x in inputs)


def default_variant(tensor: torch.Tensor) -> torch.Tensor:
    """New values in new storage for one input: floating tensors are rolled by one along every dim (a
    0-d or one-element tensor is scaled instead); integer and boolean tensors keep their values because
    they are often indices, lengths or masks whose range matters."""
    t = tensor.detach()
    if not t.is_floating_point():
        return t.clone()
    if t.numel() <= 1:
        return (t * 0.5 + 0.25).clone()
    dims = [d for d in range(t.dim()) if t.shape[d] > 1]
    return t.roll(shifts=[1] * len(dims), dims=dims).clone()


def variant_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(map_tensors(x, default_variant) for x in inputs)


def to_float64(value: Any, device: torch.device | None = None) -> Any:
    """Floating tensors cast to float64; with ``device`` every tensor is also moved there."""

    def cast(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device) if device is not None else t
        return t.to(torch.float64) if t.is_floating_point() else t

    return map_tensors(value, cast)


def move_inputs(inputs: tuple[Any, ...], device: torch.device) -> tuple[Any, ...]:
    """Inputs that live on an accelerator moved to ``device``; CPU inputs stay on the CPU on purpose
    (some workloads exist to pass CPU tensors)."""
    return tuple(map_tensors(x, lambda t: t.to(device) if t.device.type != "cpu" else t) for x in inputs)


def device_input_bytes(inputs: tuple[Any, ...]) -> int:
    """Bytes of the inputs that live on an accelerator (what a graph runner copies for non-static inputs)."""
    total = 0
    for _, t in flatten(inputs):
        if t.device.type != "cpu":
            total += t.numel() * t.element_size()
    return total
