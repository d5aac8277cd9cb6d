"""An LLM decode step whose static KV cache is passed in as inputs (a small Llama-style model of ours).

Why it matters: the cache is a large non-static input that the step writes into. PyTorch2-CG must
either copy the whole cache into its placeholders on every replay or skip capture because an input is
mutated; parameter indirection only rewrites the cache's address. The step is idempotent for a fixed
position (it writes the same key/value at the same slot), so running it twice gives the same result.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from suites.workloads.common import generator, place, randint, randn, seed_weights
from suites.workloads.registry import Tag, workload


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(max_len: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, heads, 1, head_dim); cos/sin: (1, head_dim/2) rows of the current position."""
    even, odd = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return rotated.flatten(-2)


class DecodeLayer(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.attn_norm = RMSNorm(width)
        self.q = nn.Linear(width, heads * self.head_dim, bias=False)
        self.k = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, width, bias=False)
        self.mlp_norm = RMSNorm(width)
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        position: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        batch = x.shape[0]
        h = self.attn_norm(x)
        q = self.q(h).view(batch, 1, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(batch, 1, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(batch, 1, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        slot = position.view(1)
        k_cache.index_copy_(2, slot, k)  # the static cache is an input: written in place
        v_cache.index_copy_(2, slot, v)
        groups = self.heads // self.kv_heads
        keys = k_cache.repeat_interleave(groups, dim=1)
        values = v_cache.repeat_interleave(groups, dim=1)
        visible = torch.arange(k_cache.shape[2], device=x.device) <= position
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible.view(1, 1, 1, -1))
        x = x + self.o(attn.transpose(1, 2).reshape(batch, 1, -1))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class DecodeStep(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(
        self, vocab: int, width: int, layers: int, heads: int, kv_heads: int, hidden: int, max_len: int
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(DecodeLayer(width, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        cos, sin = rope_tables(max_len, width // heads)
        self.register_buffer("rope_cos", cos)
        self.register_buffer("rope_sin", sin)

    def forward(
        self, tokens: torch.Tensor, position: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """tokens (batch, 1); position 0-d int64; caches (layers, batch, kv_heads, max_len, head_dim)."""
        x = self.embed(tokens)
        cos = self.rope_cos.index_select(0, position.view(1))
        sin = self.rope_sin.index_select(0, position.view(1))
        for i, layer in enumerate(self.layers):
            x = layer(x, position, cos, sin, k_cache[i], v_cache[i])
        return self.head(self.norm(x))[:, -1]


@workload(
    "llm_decode_static_kv",
    tags=(Tag.LLM, Tag.PI, Tag.MUTATION, Tag.VENDOR, Tag.LAUNCH_BOUND),
    sizes={
        "smoke": {
            "batch": 2,
            "vocab": 64,
            "width": 32,
            "layers": 1,
            "heads": 4,
            "kv_heads": 2,
            "hidden": 64,
            "max_len": 16,
            "position": 9,
        },
        "standard": {
            "batch": 4,
            "vocab": 32000,
            "width": 1024,
            "layers": 4,
            "heads": 16,
            "kv_heads": 4,
            "hidden": 2816,
            "max_len": 2048,
            "position": 1000,
        },
        "full": {
            "batch": 8,
            "vocab": 32000,
            "width": 2048,
            "layers": 16,
            "heads": 32,
            "kv_heads": 8,
            "hidden": 5632,
            "max_len": 4096,
            "position": 2047,
        },
    },
    mutates_inputs=True,
    code=(RMSNorm, rope_tables, apply_rope, DecodeLayer, DecodeStep),
)
def build_llm_decode(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """One decode step of a Llama-style model, KV cache passed in and written in place."""
    seed_weights()
    model = DecodeStep(
        size["vocab"],
        size["width"],
        size["layers"],
        size["heads"],
        size["kv_heads"],
        size["hidden"],
        size["max_len"],
    )
    model = place(model, device, dtype)
    gen = generator()
    head_dim = size["width"] // size["heads"]
    cache_shape = (size["layers"], size["batch"], size["kv_heads"], size["max_len"], head_dim)
    tokens = randint((size["batch"], 1), size["vocab"], device, gen)
    position = torch.tensor(size["position"], dtype=torch.int64).to(device)
    k_cache = randn(cache_shape, device, dtype, gen)
    v_cache = randn(cache_shape, device, dtype, gen)
    return model, (tokens, position, k_cache, v_cache)
