"""The TP workload table: name -> how to build the unsharded reference, shard it and draw its inputs.

Problem: TP workloads need a process group to run, so they cannot sit in the single-process registry
(suites.workloads.registry), whose builders the correctness suite calls without one; but they need the
same things: sizes per tier as data, reproducible weights and inputs, and a hash of the code that ran.

Design: ``TPWorkload`` is a frozen record of three functions (``build_full(size)`` on the CPU from a fixed
seed, ``shard(full, tp)``, ``inputs(size, seed)`` on the CPU) and a size per ``Tier``; ``TP_WORKLOADS``
is a dict filled by ``_register``; ``get`` and ``select`` read it. ``code_hash`` covers the sources of
the TP modules the model runs through and the size table.

Invariants: names are unique; every tier has a size; inputs are drawn from a seeded CPU generator, so
every rank draws the same tokens (the harness broadcasts rank 0's anyway).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any

import torch
from torch import nn

from suites.tp import collectives, layers, models
from suites.workloads.registry import Tier, WorkloadError

WEIGHT_SEED = 20260
INPUT_SEED = 4242
VARIANT_SEED = 4243  # a second input set: new values at new addresses


@dataclass(frozen=True)
class TPWorkload:
    name: str
    description: str
    build_full: Callable[[Mapping[str, Any]], nn.Module]
    shard: Callable[[Any, collectives.TPGroup], nn.Module]
    inputs: Callable[[Mapping[str, Any], int], tuple[torch.Tensor, ...]]
    sizes: Mapping[Tier, Mapping[str, Any]]
    split_dims: tuple[str, ...]  # size keys the TP world size must divide
    code: tuple[ModuleType, ...] = field(default=(collectives, layers, models), repr=False)

    def size(self, tier: Tier | str) -> Mapping[str, Any]:
        return self.sizes[Tier(tier)]

    def check_world_size(self, tier: Tier | str, world_size: int) -> str | None:
        """Why ``world_size`` cannot split this workload at ``tier``, or None."""
        size = self.size(tier)
        bad = [f"{key}={size[key]}" for key in self.split_dims if size[key] % world_size]
        if bad:
            where = f"{self.name}[{Tier(tier).value}]"
            return f"{where}: {', '.join(bad)} not divisible by the TP world size {world_size}"
        return None

    @property
    def code_hash(self) -> str:
        """sha256 (16 hex digits) of the name, the TP modules' sources and the size table."""
        digest = hashlib.sha256(self.name.encode())
        for module in self.code:
            digest.update(b"\0" + inspect.getsource(module).replace("\r\n", "\n").encode())
        digest.update(inspect.getsource(self.build_full).encode())
        digest.update(inspect.getsource(self.inputs).encode())
        sizes = {
            tier.value: dict(size) for tier, size in sorted(self.sizes.items(), key=lambda kv: kv[0].value)
        }
        digest.update(json.dumps(sizes, sort_keys=True).encode())
        return digest.hexdigest()[:16]


TP_WORKLOADS: dict[str, TPWorkload] = {}


def _register(wl: TPWorkload) -> TPWorkload:
    if wl.name in TP_WORKLOADS:
        raise ValueError(f"TP workload {wl.name!r} is already registered; names must be unique")
    missing = [tier.value for tier in Tier if tier not in wl.sizes]
    if missing:
        raise ValueError(f"TP workload {wl.name!r} has no size for tier(s) {missing}")
    TP_WORKLOADS[wl.name] = wl
    return wl


def get(name: str) -> TPWorkload:
    try:
        return TP_WORKLOADS[name]
    except KeyError:
        raise WorkloadError(f"no TP workload named {name!r}; known: {', '.join(TP_WORKLOADS)}") from None


def select(text: str | None) -> list[TPWorkload]:
    """``"all"``/empty -> every TP workload; else a comma list of names."""
    if not text or text.strip() == "all":
        return list(TP_WORKLOADS.values())
    return [get(part.strip()) for part in text.split(",") if part.strip()]


def _tokens(shape: tuple[int, int], vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.int64)


# --- xlnet_tp ------------------------------------------------------------------------------------------


def _xlnet_config(size: Mapping[str, Any]) -> models.XLNetConfig:
    return models.XLNetConfig(**dict(size))


def build_xlnet(size: Mapping[str, Any]) -> nn.Module:
    torch.manual_seed(WEIGHT_SEED)
    return models.XLNetStyle(_xlnet_config(size)).eval()


def xlnet_inputs(size: Mapping[str, Any], seed: int) -> tuple[torch.Tensor, ...]:
    return (_tokens((size["batch"], size["seq"]), size["vocab"], seed),)


def _frozen(table: Mapping[Tier, Mapping[str, Any]]) -> Mapping[Tier, Mapping[str, Any]]:
    return MappingProxyType({tier: MappingProxyType(dict(size)) for tier, size in table.items()})


_register(
    TPWorkload(
        name="xlnet_tp",
        description="XLNet-style layers (relative attention, heads split) with tied LM head, Megatron TP",
        build_full=build_xlnet,
        shard=models.shard_xlnet,
        inputs=xlnet_inputs,
        sizes=_frozen(
            {
                Tier.SMOKE: dict(vocab=64, width=32, heads=4, layers=2, hidden=64, seq=8, batch=2),
                # XLNet-large widths (d_model 1024, 16 heads, d_inner 4096), 4 layers, 1 x 128 tokens.
                Tier.STANDARD: dict(
                    vocab=32000, width=1024, heads=16, layers=4, hidden=4096, seq=128, batch=1
                ),
                # XLNet-large: 24 layers, 1 x 512 tokens.
                Tier.FULL: dict(vocab=32000, width=1024, heads=16, layers=24, hidden=4096, seq=512, batch=1),
            }
        ),
        split_dims=("heads", "hidden"),
    )
)


# --- mlp_decode_tp -------------------------------------------------------------------------------------


def build_decode(size: Mapping[str, Any]) -> nn.Module:
    torch.manual_seed(WEIGHT_SEED)
    return models.DecodeMLP(models.DecodeConfig(**dict(size))).eval()


def decode_inputs(size: Mapping[str, Any], seed: int) -> tuple[torch.Tensor, ...]:
    return (_tokens((size["batch"], 1), size["vocab"], seed),)


_register(
    TPWorkload(
        name="mlp_decode_tp",
        description="LLM-decode-style step: SwiGLU MLP stack, one token per sequence, Megatron TP",
        build_full=build_decode,
        shard=models.shard_decode,
        inputs=decode_inputs,
        sizes=_frozen(
            {
                Tier.SMOKE: {"vocab": 64, "width": 32, "hidden": 64, "layers": 2, "batch": 2},
                # Llama-2-7B MLP widths, 8 layers, batch 1: launch-bound where CUDA graphs pay.
                Tier.STANDARD: {"vocab": 32000, "width": 4096, "hidden": 11008, "layers": 8, "batch": 1},
                Tier.FULL: {"vocab": 32000, "width": 4096, "hidden": 11008, "layers": 32, "batch": 4},
            }
        ),
        split_dims=("hidden",),
    )
)
