"""A speech-transformer-style encoder-decoder (our own implementation, after the TorchBench model).

Filter-bank frames go through a linear input layer and a stack of self-attention layers; a token
decoder attends to them. As in speech data pipelines, the frame lengths arrive as a CPU tensor and the
padding and causal masks are built on the CPU and then copied to the device: CPU work that keeps
PyTorch2-CG from capturing the whole step without CGCT.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from suites.workloads.common import generator, place, randint, randn, seed_weights
from suites.workloads.registry import Tag, workload


def sinusoid_table(length: int, width: int) -> torch.Tensor:
    position = torch.arange(length, dtype=torch.float32)[:, None]
    rate = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    table = torch.zeros(length, width)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)
    return table


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """mask: boolean, True where attention is allowed, broadcastable to (batch, heads, q, k)."""
        b, n, w = x.shape
        split = lambda t: t.view(b, -1, self.heads, w // self.heads).transpose(1, 2)  # noqa: E731
        out = F.scaled_dot_product_attention(
            split(self.q(x)), split(self.k(memory)), split(self.v(memory)), mask
        )
        return self.o(out.transpose(1, 2).reshape(b, n, w))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, ff: int, cross: bool) -> None:
        super().__init__()
        self.self_norm, self.self_attn = nn.LayerNorm(width), Attention(width, heads)
        self.cross_norm = nn.LayerNorm(width) if cross else None
        self.cross_attn = Attention(width, heads) if cross else None
        self.ff_norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, ff), nn.ReLU(), nn.Linear(ff, width))

    def forward(
        self,
        x: torch.Tensor,
        self_mask: torch.Tensor,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = self.self_norm(x)
        x = x + self.self_attn(h, h, self_mask)
        if self.cross_attn is not None and self.cross_norm is not None and memory is not None:
            x = x + self.cross_attn(self.cross_norm(x), memory, memory_mask)
        return x + self.ff(self.ff_norm(x))


class SpeechTransformer(nn.Module):
    positions: torch.Tensor

    def __init__(
        self, mels: int, vocab: int, width: int, heads: int, ff: int, enc: int, dec: int, max_len: int
    ):
        super().__init__()
        self.input = nn.Linear(mels, width)
        self.input_norm = nn.LayerNorm(width)
        self.encoder = nn.ModuleList(Block(width, heads, ff, cross=False) for _ in range(enc))
        self.embed = nn.Embedding(vocab, width)
        self.decoder = nn.ModuleList(Block(width, heads, ff, cross=True) for _ in range(dec))
        self.out_norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab)
        self.register_buffer("positions", sinusoid_table(max_len, width))

    def forward(
        self, frames: torch.Tensor, frame_lengths: torch.Tensor, tokens: torch.Tensor
    ) -> torch.Tensor:
        """frames (batch, time, mels); frame_lengths (batch,) on the CPU; tokens (batch, steps)."""
        device = frames.device
        time, steps = frames.shape[1], tokens.shape[1]
        valid = (torch.arange(time)[None, :] < frame_lengths[:, None]).to(device)  # built on the CPU
        key_mask = valid[:, None, None, :]
        causal = torch.ones(steps, steps, dtype=torch.bool).tril().to(device)  # built on the CPU
        x = self.input_norm(self.input(frames)) + self.positions[:time]
        for block in self.encoder:
            x = block(x, key_mask)
        y = self.embed(tokens) + self.positions[:steps]
        for block in self.decoder:
            y = block(y, causal, x, key_mask)
        return self.out(self.out_norm(y))


@workload(
    "speech_transformer",
    tags=(Tag.SPEECH, Tag.TRANSFORMER, Tag.CGCT, Tag.VENDOR),
    sizes={
        "smoke": {
            "batch": 2,
            "time": 24,
            "steps": 6,
            "mels": 16,
            "vocab": 50,
            "width": 32,
            "heads": 4,
            "ff": 64,
            "enc": 1,
            "dec": 1,
        },
        "standard": {
            "batch": 8,
            "time": 256,
            "steps": 32,
            "mels": 80,
            "vocab": 4233,
            "width": 256,
            "heads": 4,
            "ff": 1024,
            "enc": 4,
            "dec": 2,
        },
        "full": {
            "batch": 32,
            "time": 512,
            "steps": 64,
            "mels": 80,
            "vocab": 4233,
            "width": 512,
            "heads": 8,
            "ff": 2048,
            "enc": 12,
            "dec": 6,
        },
    },
    code=(sinusoid_table, Attention, Block, SpeechTransformer),
)
def build_speech_transformer(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """Speech-transformer-style encoder-decoder with CPU-built padding masks."""
    seed_weights()
    max_len = max(size["time"], size["steps"])
    model = SpeechTransformer(
        size["mels"],
        size["vocab"],
        size["width"],
        size["heads"],
        size["ff"],
        size["enc"],
        size["dec"],
        max_len,
    )
    model = place(model, device, dtype)
    gen = generator()
    batch, time = size["batch"], size["time"]
    frames = randn((batch, time, size["mels"]), device, dtype, gen)
    lengths = torch.tensor([time - (i * time) // (2 * batch) for i in range(batch)], dtype=torch.int64)  # CPU
    tokens = randint((batch, size["steps"]), size["vocab"], device, gen)
    return model, (frames, lengths, tokens)
