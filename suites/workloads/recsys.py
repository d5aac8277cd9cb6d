"""Recommender workloads (our own implementations of the paper's TorchBench recommenders).

- ``nvidia_deeprecommender``: a deep autoencoder over user-item rating vectors (SELU layers, decoder
  mirroring the encoder). The rating batch is a large dense input: PyTorch2-CG copies it on every replay.
- ``dlrm``: a DLRM-style click model: bottom MLP over dense features, one ``EmbeddingBag`` per sparse
  feature, pairwise dot-product interaction, top MLP. The interaction's pair indices are built as CPU
  tensors on every call, as the reference implementation does: a CPU op inside the graph.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import nn

from suites.workloads.common import generator, place, randint, seed_weights, uniform
from suites.workloads.registry import Tag, workload


class AutoEncoder(nn.Module):
    def __init__(self, sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.encoder = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))
        rev = sizes[::-1]
        self.decoder = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(rev))
        self.drop = nn.Dropout(0.8)

    def forward(self, ratings: torch.Tensor) -> torch.Tensor:
        x = ratings
        for layer in self.encoder:
            x = torch.selu(layer(x))
        x = self.drop(x)
        for i, layer in enumerate(self.decoder):
            x = layer(x)
            if i < len(self.decoder) - 1:
                x = torch.selu(x)
        return x


@workload(
    "nvidia_deeprecommender",
    tags=(Tag.RECSYS, Tag.PI, Tag.VENDOR),
    sizes={
        "smoke": {"batch": 16, "items": 64, "hidden": (32, 32, 64)},
        "standard": {"batch": 8192, "items": 4096, "hidden": (512, 512, 1024)},
        "full": {"batch": 8192, "items": 17768, "hidden": (512, 512, 1024)},
    },
    code=(AutoEncoder,),
)
def build_deeprecommender(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """DeepRecommender-style autoencoder over sparse-looking rating vectors."""
    seed_weights()
    model = place(AutoEncoder((size["items"], *size["hidden"])), device, dtype)
    gen = generator()
    shape = (size["batch"], size["items"])
    ratings = torch.randint(1, 6, shape, generator=gen).float() * (torch.rand(shape, generator=gen) < 0.05)
    return model, (ratings.to(device, dtype),)


class DLRM(nn.Module):
    def __init__(
        self, dense: int, bottom: tuple[int, ...], top: tuple[int, ...], tables: int, rows: int, dim: int
    ):
        super().__init__()
        self.bottom = self._mlp((dense, *bottom, dim))
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        features = tables + 1
        self.top = self._mlp((dim + features * (features - 1) // 2, *top, 1))

    @staticmethod
    def _mlp(widths: tuple[int, ...]) -> nn.Sequential:
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*layers[:-1])

    def forward(self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bottom(dense))
        pooled = [table(indices[i], offsets[i]) for i, table in enumerate(self.tables)]
        z = torch.stack([x, *pooled], dim=1)
        scores = torch.bmm(z, z.transpose(1, 2))
        n = z.shape[1]
        li = torch.tensor([i for i in range(n) for j in range(i)])  # CPU tensors, rebuilt every call
        lj = torch.tensor([j for i in range(n) for j in range(i)])
        pairs = scores[:, li, lj]
        return torch.sigmoid(self.top(torch.cat([x, pairs], dim=1)))


@workload(
    "dlrm",
    tags=(Tag.RECSYS, Tag.CGCT, Tag.VENDOR),
    sizes={
        "smoke": {
            "batch": 8,
            "dense": 13,
            "bottom": (16,),
            "top": (16,),
            "tables": 3,
            "rows": 50,
            "dim": 8,
            "pooling": 2,
        },
        "standard": {
            "batch": 2048,
            "dense": 13,
            "bottom": (512, 256),
            "top": (512, 256),
            "tables": 26,
            "rows": 100000,
            "dim": 64,
            "pooling": 1,
        },
        "full": {
            "batch": 16384,
            "dense": 13,
            "bottom": (512, 256),
            "top": (1024, 1024, 512, 256),
            "tables": 26,
            "rows": 1000000,
            "dim": 128,
            "pooling": 1,
        },
    },
    code=(DLRM,),
)
def build_dlrm(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """DLRM-style model: embedding bags, dot interaction, MLPs."""
    seed_weights()
    model = DLRM(size["dense"], size["bottom"], size["top"], size["tables"], size["rows"], size["dim"])
    model = place(model, device, dtype)
    gen = generator()
    batch, pooling = size["batch"], size["pooling"]
    dense = uniform((batch, size["dense"]), 0.0, 1.0, device, dtype, gen)
    indices = randint((size["tables"], batch * pooling), size["rows"], device, gen)
    offsets = (torch.arange(batch, dtype=torch.int64) * pooling).repeat(size["tables"], 1).to(device)
    return model, (dense, indices, offsets)
