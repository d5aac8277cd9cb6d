"""Small synthetic workloads, each isolating one reason CUDA graphs help, fail or cost.

- ``seed_elementwise_1m``: four elementwise ops on 1M floats, the first eager-vs-graph demo.
- ``elementwise_64x1m``: three elementwise ops on a 64x1M input; PyTorch2-CG copies 256 MB per replay
  and loses to plain Inductor (DESIGN.md 4): where PI and SCG pay.
- ``linear8_cpu_scalar``: eight Linear(256) layers, each scaled by a 0-d CPU tensor input; graph
  partitions split it, without partitions capture is disabled (CGCT's target).
- ``cpu_position_ids``: position ids made with ``arange`` on the CPU and then moved to the device.
- ``cpu_buffer_anchors``: a detection-style box decoder whose anchor buffer and clamp constant stay on
  the CPU.
- ``mlp``: a plain multi-layer perceptron (cuBLAS kernels only).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import nn

from suites.workloads.common import generator, place, randint, randn, seed_weights
from suites.workloads.registry import Tag, workload


class SeedElementwise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(torch.relu(x * 2.0 + 1.0))


@workload(
    "seed_elementwise_1m",
    tags=(Tag.SYNTHETIC, Tag.LAUNCH_BOUND, Tag.PI, Tag.SCG),
    sizes={"smoke": {"numel": 4096}, "standard": {"numel": 1 << 20}, "full": {"numel": 1 << 20}},
    code=(SeedElementwise,),
)
def build_seed_elementwise(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """Four elementwise ops on 1M floats (mul, add, relu, sin)."""
    seed_weights()
    return place(SeedElementwise(), device, dtype), (randn((size["numel"],), device, dtype, generator()),)


class ThreeElementwise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2.0 + 1.0)


@workload(
    "elementwise_64x1m",
    tags=(Tag.SYNTHETIC, Tag.PI, Tag.SCG),
    sizes={
        "smoke": {"rows": 4, "cols": 1024},
        "standard": {"rows": 64, "cols": 1 << 20},
        "full": {"rows": 64, "cols": 1 << 20},
    },
    code=(ThreeElementwise,),
)
def build_elementwise_64x1m(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """Three elementwise ops on a 64x1M input: the input copy dominates a graph replay."""
    seed_weights()
    x = randn((size["rows"], size["cols"]), device, dtype, generator())
    return place(ThreeElementwise(), device, dtype), (x,)


class LinearsWithCpuScalars(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor, *scales: torch.Tensor) -> torch.Tensor:
        for layer, scale in zip(self.layers, scales, strict=True):
            x = layer(x) * scale
        return x


@workload(
    "linear8_cpu_scalar",
    tags=(Tag.SYNTHETIC, Tag.CGCT, Tag.VENDOR, Tag.LAUNCH_BOUND),
    sizes={
        "smoke": {"batch": 8, "width": 32, "depth": 8},
        "standard": {"batch": 1024, "width": 256, "depth": 8},
        "full": {"batch": 1024, "width": 256, "depth": 8},
    },
    code=(LinearsWithCpuScalars,),
)
def build_linear8_cpu_scalar(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """Eight Linear(256) layers, each output scaled by a 0-d CPU tensor input."""
    seed_weights()
    model = place(LinearsWithCpuScalars(size["width"], size["depth"]), device, dtype)
    gen = generator()
    x = randn((size["batch"], size["width"]), device, dtype, gen)
    scales = tuple(torch.tensor(0.5 + 0.1 * i, dtype=dtype) for i in range(size["depth"]))  # CPU on purpose
    return model, (x, *scales)


class CpuPositionIds(nn.Module):
    def __init__(self, vocab: int, width: int, max_len: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(max_len, width)
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1]).to(ids.device)  # made on the CPU, then copied
        h = self.norm(self.tokens(ids) + self.positions(positions)[None])
        h = h + self.down(torch.nn.functional.gelu(self.up(h)))
        return self.head(h)


@workload(
    "cpu_position_ids",
    tags=(Tag.SYNTHETIC, Tag.CGCT),
    sizes={
        "smoke": {"batch": 2, "seq": 16, "vocab": 64, "width": 32},
        "standard": {"batch": 8, "seq": 128, "vocab": 32000, "width": 512},
        "full": {"batch": 32, "seq": 512, "vocab": 32000, "width": 1024},
    },
    code=(CpuPositionIds,),
)
def build_cpu_position_ids(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """Token plus position embeddings where the position ids come from a CPU ``arange``."""
    seed_weights()
    model = place(CpuPositionIds(size["vocab"], size["width"], size["seq"]), device, dtype)
    return model, (randint((size["batch"], size["seq"]), size["vocab"], device, generator()),)


def make_anchors(height: int, width: int, stride: int, sizes: tuple[int, ...]) -> torch.Tensor:
    """(height*width*len(sizes), 4) square anchors (cx, cy, w, h) on a regular grid."""
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    centres = torch.stack([(xs + 0.5) * stride, (ys + 0.5) * stride], dim=-1).reshape(-1, 1, 2)
    extent = torch.tensor(sizes, dtype=torch.float32).reshape(1, -1, 1).expand(centres.shape[0], -1, 2)
    return torch.cat([centres.expand(-1, len(sizes), 2), extent], dim=-1).reshape(-1, 4).float()


class AnchorBoxDecoder(nn.Module):
    """Box regression head + decoding against anchors kept on the CPU (as detection code often does)."""

    anchors: torch.Tensor

    def __init__(self, channels: int, anchors: torch.Tensor, per_cell: int) -> None:
        super().__init__()
        self.per_cell = per_cell
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.deltas = nn.Conv2d(channels, 4 * per_cell, 1)
        self.register_buffer("anchors", anchors)
        self.bbox_clamp = torch.tensor(math.log(1000.0 / 16))  # a plain tensor attribute: never moved

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        d = self.deltas(torch.relu(self.conv(features)))
        n = features.shape[0]
        d = d.permute(0, 2, 3, 1).reshape(n, -1, 4)
        anchors = self.anchors.to(features.device)
        limit = self.bbox_clamp.to(features.device, features.dtype)
        cx = anchors[:, 0] + d[..., 0] * anchors[:, 2]
        cy = anchors[:, 1] + d[..., 1] * anchors[:, 3]
        w = anchors[:, 2] * torch.exp(torch.minimum(d[..., 2], limit))
        h = anchors[:, 3] * torch.exp(torch.minimum(d[..., 3], limit))
        return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)


@workload(
    "cpu_buffer_anchors",
    tags=(Tag.SYNTHETIC, Tag.CGCT, Tag.VISION),
    sizes={
        "smoke": {"batch": 1, "channels": 8, "height": 8, "width": 8},
        "standard": {"batch": 8, "channels": 128, "height": 64, "width": 64},
        "full": {"batch": 16, "channels": 256, "height": 100, "width": 152},
    },
    code=(AnchorBoxDecoder, make_anchors),
)
def build_cpu_buffer_anchors(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """A box decoder whose anchor buffer stays on the CPU after the model moved to the device."""
    seed_weights()
    sizes = (32, 64, 128)
    anchors = make_anchors(size["height"], size["width"], 16, sizes)
    model = place(AnchorBoxDecoder(size["channels"], anchors, len(sizes)), device, dtype)
    model.anchors = model.anchors.cpu()  # stays registered as a buffer, now on the CPU
    gen = generator()
    features = randn((size["batch"], size["channels"], size["height"], size["width"]), device, dtype, gen)
    return model, (features,)


class MLP(nn.Module):
    def __init__(self, widths: tuple[int, ...]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.nn.functional.gelu(x)
        return x


@workload(
    "mlp",
    tags=(Tag.SYNTHETIC, Tag.VENDOR),
    sizes={
        "smoke": {"batch": 4, "widths": (32, 64, 64, 16)},
        "standard": {"batch": 64, "widths": (1024, 4096, 4096, 4096, 1024)},
        "full": {"batch": 512, "widths": (4096, 16384, 16384, 4096)},
    },
    code=(MLP,),
)
def build_mlp(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """A GELU multi-layer perceptron."""
    seed_weights()
    widths = tuple(size["widths"])
    return place(MLP(widths), device, dtype), (randn((size["batch"], widths[0]), device, dtype, generator()),)
