"""The TP workloads' models: each an unsharded reference and a function that shards it over a TP group.

- ``XLNetStyle``: a stack of XLNet layers (relative positional attention as in XLNet's ``rel_attn_core``
  with the two relative biases and ``rel_shift``, post-LayerNorm residuals, GELU feed-forward) under a
  token embedding with a tied LM head. Our own small implementation of the structure of HF's
  ``XLNetLMHeadModel`` in inference (no memory, no two-stream attention, no dropout).
  ``shard_xlnet`` splits attention by heads (q, k, v and the positional projection r column-parallel,
  the two relative biases by head, the output projection o row-parallel) and the feed-forward into a
  column-parallel first and a row-parallel second layer: two all-reduces per layer.
- ``DecodeMLP``: an LLM-decode-style stack: one token per sequence, RMSNorm and a SwiGLU MLP per layer
  (gate and up column-parallel, down row-parallel), embedding and LM head replicated: one all-reduce
  per layer on a launch-bound step, the shape where CUDA graphs pay.

Invariant: a shard function leaves the reference untouched and returns a new model: replicated modules
(embeddings, norms, LM heads) are copies of the reference's and every cut weight comes from the reference
module passed in, so TP and reference share their numbers (see suites.tp.layers).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from suites.tp.collectives import TPGroup
from suites.tp.layers import ColumnParallelLinear, RowParallelLinear, shard_dim, shard_range

# --- XLNet-style stack --------------------------------------------------------------------------------


@dataclass(frozen=True)
class XLNetConfig:
    vocab: int
    width: int
    heads: int
    layers: int
    hidden: int
    seq: int
    batch: int
    eps: float = 1e-12

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


def relative_positions(seq: int, width: int) -> torch.Tensor:
    """XLNet's sinusoidal embedding of relative distances seq, seq-1, ..., -seq+1 ((2 seq, width)), for
    bidirectional attention without memory (klen = qlen = seq)."""
    positions = torch.arange(seq, -seq, -1.0, dtype=torch.float64)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, width, 2.0, dtype=torch.float64) / width))
    angles = torch.outer(positions, inv_freq)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).float()


def rel_shift(scores: torch.Tensor, klen: int) -> torch.Tensor:
    """XLNet's ``rel_shift_bnij``: (b, n, i, 2 klen) position scores -> (b, n, i, klen) aligned on i - j."""
    b, n, i, j = scores.shape
    shifted = scores.reshape(b, n, j, i)[:, :, 1:, :].reshape(b, n, i, j - 1)
    return shifted[..., :klen]


class XLNetLayer(nn.Module):
    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        width, heads, head_dim = config.width, config.heads, config.head_dim
        self.heads, self.head_dim = heads, head_dim
        self.q = nn.Linear(width, heads * head_dim, bias=False)
        self.k = nn.Linear(width, heads * head_dim, bias=False)
        self.v = nn.Linear(width, heads * head_dim, bias=False)
        self.r = nn.Linear(width, heads * head_dim, bias=False)
        self.o: nn.Module = nn.Linear(heads * head_dim, width, bias=False)
        self.r_w_bias = nn.Parameter(torch.randn(heads, head_dim) * 0.02)
        self.r_r_bias = nn.Parameter(torch.randn(heads, head_dim) * 0.02)
        self.attn_norm = nn.LayerNorm(width, eps=config.eps)
        self.ff1: nn.Module = nn.Linear(width, config.hidden)
        self.ff2: nn.Module = nn.Linear(config.hidden, width)
        self.ff_norm = nn.LayerNorm(width, eps=config.eps)

    def forward(self, h: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, s, _ = h.shape
        heads, head_dim = self.heads, self.head_dim  # this rank's heads in a TP layer
        q = self.q(h).view(b, s, heads, head_dim)
        k = self.k(h).view(b, s, heads, head_dim)
        v = self.v(h).view(b, s, heads, head_dim)
        kr = self.r(pos).view(pos.shape[0], heads, head_dim)
        content = torch.einsum("bind,bjnd->bnij", q + self.r_w_bias, k)
        position = rel_shift(torch.einsum("bind,jnd->bnij", q + self.r_r_bias, kr), klen=s)
        prob = torch.softmax((content + position) * (1.0 / math.sqrt(head_dim)), dim=-1)
        attended = torch.einsum("bnij,bjnd->bind", prob, v).reshape(b, s, heads * head_dim)
        h = self.attn_norm(self.o(attended) + h)
        return self.ff_norm(self.ff2(F.gelu(self.ff1(h))) + h)


class XLNetStyle(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab, config.width)
        self.layers = nn.ModuleList(XLNetLayer(config) for _ in range(config.layers))
        self.lm_bias = nn.Parameter(torch.zeros(config.vocab))
        self.register_buffer("pos", relative_positions(config.seq, config.width), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embedding(tokens)
        for layer in self.layers:
            h = layer(h, self.pos)
        return F.linear(h, self.embedding.weight, self.lm_bias)


def shard_xlnet(full: XLNetStyle, tp: TPGroup) -> XLNetStyle:
    """``full`` with every layer split over ``tp``: heads and feed-forward width divided by the world."""
    shard_range(full.config.heads, tp.rank, tp.world_size, "attention heads")
    model = copy.deepcopy(full)  # replicated parts (embedding, LM bias, positions) stay as they are
    model.layers = nn.ModuleList(_shard_xlnet_layer(layer, tp) for layer in full.layers)  # type: ignore[arg-type]
    return model


def _shard_xlnet_layer(full: XLNetLayer, tp: TPGroup) -> XLNetLayer:
    layer = copy.deepcopy(full)  # norms and biases stay replicated; the linears are replaced
    layer.heads = full.heads // tp.world_size
    for name in ("q", "k", "v", "r"):
        setattr(layer, name, ColumnParallelLinear.from_full(getattr(full, name), tp, f"{name} heads"))
    layer.o = RowParallelLinear.from_full(full.o, tp, "o heads")
    layer.r_w_bias = nn.Parameter(shard_dim(full.r_w_bias, 0, tp, "r_w_bias heads"), requires_grad=False)
    layer.r_r_bias = nn.Parameter(shard_dim(full.r_r_bias, 0, tp, "r_r_bias heads"), requires_grad=False)
    layer.ff1 = ColumnParallelLinear.from_full(full.ff1, tp, "feed-forward width")
    layer.ff2 = RowParallelLinear.from_full(full.ff2, tp, "feed-forward width")
    return layer


# --- LLM-decode-style MLP stack ------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeConfig:
    vocab: int
    width: int
    hidden: int
    layers: int
    batch: int
    eps: float = 1e-6


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class DecodeBlock(nn.Module):
    def __init__(self, config: DecodeConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(config.width, config.eps)
        self.gate: nn.Module = nn.Linear(config.width, config.hidden, bias=False)
        self.up: nn.Module = nn.Linear(config.width, config.hidden, bias=False)
        self.down: nn.Module = nn.Linear(config.hidden, config.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class DecodeMLP(nn.Module):
    """Token ids (batch, 1) -> logits (batch, 1, vocab): one decode step through a stack of MLP blocks."""

    def __init__(self, config: DecodeConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab, config.width)
        self.blocks = nn.ModuleList(DecodeBlock(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.width, config.eps)
        self.head = nn.Linear(config.width, config.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def shard_decode(full: DecodeMLP, tp: TPGroup) -> DecodeMLP:
    """``full`` with every block's MLP split over ``tp`` (gate/up by columns, down by rows)."""
    model = copy.deepcopy(full)
    for block, source in zip(model.blocks, full.blocks, strict=True):
        assert isinstance(block, DecodeBlock) and isinstance(source, DecodeBlock)
        block.gate = ColumnParallelLinear.from_full(source.gate, tp, "MLP hidden width")
        block.up = ColumnParallelLinear.from_full(source.up, tp, "MLP hidden width")
        block.down = RowParallelLinear.from_full(source.down, tp, "MLP hidden width")
    return model
