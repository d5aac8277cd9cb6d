"""Training workloads: a model, its loss and its targets, and the optimizer one training step uses.

Problem: the suites must run, check and time training (forward, backward, optimizer step) in every mode
the way they do inference, and the store, the report and the dashboards must show it beside inference
with no schema change. So a training workload is an ordinary registered workload (``<name>_train``,
tagged ``training``) whose model is a ``TrainingModel``: its ``forward(*inputs)`` returns the scalar
loss (the loss is part of the compiled forward), and it names the optimizer of its step
(``OptimizerSpec``). suites/training.py turns one into a ``TrainStep``: one call, one iteration.

Design: the models are the inference workloads' (reused through the registry, so a change there changes
both code hashes) or built with the same helpers (suites.workloads.hf); only the loss, the targets and
the sizes are new. The DCGAN-style step is written here: generator and discriminator losses are summed
into one loss whose backward gives each network only its own gradients (the generator's loss sees the
discriminator through detached parameters, the discriminator's loss sees a detached fake), so one
backward and one optimizer step update both (a simultaneous, not alternating, GAN step).

Sizes: ``smoke`` is the inference workload's smoke size (a CPU runs three steps in well under a second
eagerly). ``standard`` uses the batch sizes of the training issue (XLNet 8, MT5 16, BlenderbotSmall 64,
DistilGPT2 16, DeBERTa 8, BERT 16, DCGAN 32, DeepRecommender 256) with the inference workloads'
standard widths and layer counts (BERT: bert-base widths, 4 layers) and sequences of 128 tokens (64
for MT5's encoder and decoder and for BlenderbotSmall's decoder), shorter than the published 512 so
that every mode's step fits one GPU lease. ``full`` keeps the inference workloads' full sizes with
the issue's batch sizes.

Mixed precision: ``*_train_amp`` workloads (size key ``autocast``) run the forward under bfloat16
autocast; the model and its optimizer stay float32.

Invariants:
- A builder returns its model in eval mode (``place``): called directly, as the registry's smoke test
  does, the loss is deterministic. ``TrainStep`` switches its own copy to train mode (dropout on).
- Targets come from a seeded generator, as inputs do: every call of a builder returns the same ones.
- Every floating parameter receives a gradient from the loss, except parameters the model itself never
  uses (which then have none in every mode alike).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from suites.workloads.common import generator, place, randn, seed_weights
from suites.workloads.hf import hf_model, special_tokens, token_ids
from suites.workloads.registry import Tag, get, workload


class OptimizerKind(str, enum.Enum):
    SGD = "sgd"
    ADAM = "adam"
    ADAMW = "adamw"


@dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer of a training step. ``capturable`` (Adam, AdamW) keeps the step count on the
    device, which modes that replay CUDA graphs need; SGD has no device-side state to keep."""

    kind: OptimizerKind
    lr: float
    momentum: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0

    def make(self, params: Iterable[nn.Parameter], *, capturable: bool = False) -> torch.optim.Optimizer:
        trainable = [p for p in params if p.requires_grad]
        if self.kind is OptimizerKind.SGD:
            return torch.optim.SGD(
                trainable, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
            )
        optimizer = torch.optim.AdamW if self.kind is OptimizerKind.ADAMW else torch.optim.Adam
        return optimizer(
            trainable, lr=self.lr, betas=self.betas, weight_decay=self.weight_decay, capturable=capturable
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "lr": self.lr,
            "momentum": self.momentum,
            "betas": list(self.betas),
            "weight_decay": self.weight_decay,
        }


SGD_MOMENTUM = OptimizerSpec(OptimizerKind.SGD, lr=1e-2, momentum=0.9)
ADAMW = OptimizerSpec(OptimizerKind.ADAMW, lr=1e-4, weight_decay=0.01)
DCGAN_ADAM = OptimizerSpec(OptimizerKind.ADAM, lr=2e-4, betas=(0.5, 0.999))


class TrainingModel(nn.Module):
    """A module whose ``forward(*inputs)`` returns the scalar training loss; ``optimizer_spec`` names
    the optimizer of its step; ``autocast`` (a dtype name, e.g. ``"bfloat16"``) runs the forward under
    ``torch.autocast`` with that dtype (mixed precision: parameters, gradients and steps stay float32)."""

    optimizer_spec: OptimizerSpec = SGD_MOMENTUM
    autocast: str | None = None


class LanguageModelLoss(TrainingModel):
    """Token cross-entropy of a model returning ``logits`` (or a tensor); the last input is the targets."""

    def __init__(self, model: nn.Module, optimizer_spec: OptimizerSpec) -> None:
        super().__init__()
        self.model = model
        self.optimizer_spec = optimizer_spec

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        *model_inputs, targets = inputs
        out = self.model(*model_inputs)
        logits = out["logits"] if isinstance(out, Mapping) else out
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float64 stays float64
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class MaskedRatingLoss(TrainingModel):
    """DeepRecommender's loss: mean squared error over the ratings that exist (non-zero)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.optimizer_spec = SGD_MOMENTUM

    def forward(self, ratings: torch.Tensor) -> torch.Tensor:
        mask = (ratings != 0).to(ratings.dtype)
        error = (self.model(ratings) - ratings) * mask
        return (error * error).sum() / mask.sum().clamp(min=1.0)


def _hf_sizes(base: str, standard: dict[str, int], full: dict[str, int]) -> dict[str, dict[str, Any]]:
    return {
        "smoke": {"base": base, "base_tier": "smoke", "overrides": {}},
        "standard": {"base": base, "base_tier": "standard", "overrides": standard},
        "full": {"base": base, "base_tier": "full", "overrides": full},
    }


def _from_inference(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """The inference workload ``size["base"]`` at its tier's size (batch and lengths overridden), with
    token targets as long as the logits' sequence and an AdamW step."""
    base = get(size["base"])
    base_size = {**base.size(size["base_tier"]), **size["overrides"]}
    model, inputs = base.builder(base_size, device, dtype)
    seq = base_size.get("decoder_seq", base_size["seq"])
    gen = generator()
    gen.manual_seed(gen.initial_seed() + 1)  # targets: drawn apart from the inputs' stream
    targets = token_ids(base_size["batch"], seq, base_size["config"]["vocab_size"], device, gen)
    loss = LanguageModelLoss(model, ADAMW)
    loss.autocast = size.get("autocast")
    return place(loss, device, dtype), (*inputs, targets)


_TRANSFORMERS: tuple[tuple[str, dict[str, int], dict[str, int]], ...] = (
    ("XLNetLMHeadModel", {"batch": 8, "seq": 128}, {"batch": 8, "seq": 512}),
    ("MT5ForConditionalGeneration", {"batch": 16, "seq": 64, "decoder_seq": 64}, {"batch": 16}),
    ("BlenderbotSmallForConditionalGeneration", {"batch": 64, "seq": 128, "decoder_seq": 64}, {"batch": 64}),
    ("DistilGPT2", {"batch": 16, "seq": 128}, {"batch": 16, "seq": 512}),
)
for _base, _standard, _full in _TRANSFORMERS:
    workload(
        f"{_base}_train",
        sizes=_hf_sizes(_base, _standard, _full),
        tags=(Tag.TRAINING, *get(_base).tags),
        requires=get(_base).requires,
        description=f"{_base} training step: token cross-entropy, AdamW.",
        code=(get(_base).builder, *get(_base).code, LanguageModelLoss, OptimizerSpec),
    )(_from_inference)


def _amp(sizes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {tier: {**size, "autocast": "bfloat16"} for tier, size in sizes.items()}


workload(
    "DistilGPT2_train_amp",
    sizes=_amp(_hf_sizes("DistilGPT2", _TRANSFORMERS[-1][1], _TRANSFORMERS[-1][2])),
    tags=(Tag.TRAINING, *get("DistilGPT2").tags),
    requires=get("DistilGPT2").requires,
    description="DistilGPT2 training step under bfloat16 autocast: token cross-entropy, AdamW.",
    code=(get("DistilGPT2").builder, *get("DistilGPT2").code, LanguageModelLoss, OptimizerSpec),
)(_from_inference)


def _masked_lm(model_class: str, config_class: str, config: dict[str, Any]) -> Any:
    def build(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
        merged = {**config, **size["config"]}
        model = hf_model(model_class, config_class, merged)
        gen = generator()
        ids = token_ids(size["batch"], size["seq"], merged["vocab_size"], device, gen)
        targets = token_ids(size["batch"], size["seq"], merged["vocab_size"], device, gen)
        loss = LanguageModelLoss(model, ADAMW)
        loss.autocast = size.get("autocast")
        return place(loss, device, dtype), (ids, targets)

    return build


_SMALL = {"num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": 32, "intermediate_size": 64}
_DEBERTA = {
    "relative_attention": True,
    "pos_att_type": ["c2p", "p2c"],
    "position_biased_input": False,
    "max_relative_positions": -1,
    **special_tokens(50265),
}
_MASKED_LMS: tuple[tuple[str, str, dict[str, Any], int, int, tuple[Tag, ...], bool], ...] = (
    ("DebertaForMaskedLM", "DebertaConfig", _DEBERTA, 50265, 8, (Tag.CGCT, Tag.LAUNCH_BOUND), False),
    ("BertForMaskedLM", "BertConfig", special_tokens(30522), 30522, 16, (Tag.LAUNCH_BOUND,), False),
    ("BertForMaskedLM", "BertConfig", special_tokens(30522), 30522, 16, (Tag.LAUNCH_BOUND,), True),
)
for _model, _config, _defaults, _vocab, _batch, _tags, _autocast in _MASKED_LMS:
    _sizes: dict[str, dict[str, Any]] = {
        "smoke": {"batch": 1, "seq": 16, "config": {"vocab_size": 256, **_SMALL}},
        "standard": {"batch": _batch, "seq": 128, "config": {"vocab_size": _vocab, "num_hidden_layers": 4}},
        "full": {"batch": _batch, "seq": 512, "config": {"vocab_size": _vocab}},
    }
    workload(
        f"{_model}_train_amp" if _autocast else f"{_model}_train",
        sizes=_amp(_sizes) if _autocast else _sizes,
        tags=(Tag.TRAINING, Tag.TRANSFORMER, *_tags),
        description=f"{_model} training step{' under bfloat16 autocast' if _autocast else ''}: "
        "masked-LM cross-entropy over every token, AdamW.",
        requires=("transformers",),
        code=(hf_model, token_ids, LanguageModelLoss, OptimizerSpec),
    )(_masked_lm(_model, _config, _defaults))


@workload(
    "nvidia_deeprecommender_train",
    sizes={
        "smoke": {"base_tier": "smoke", "overrides": {}},
        "standard": {"base_tier": "standard", "overrides": {"batch": 256}},
        "full": {"base_tier": "full", "overrides": {"batch": 256}},
    },
    tags=(Tag.TRAINING, *get("nvidia_deeprecommender").tags),
    code=(get("nvidia_deeprecommender").builder, *get("nvidia_deeprecommender").code, MaskedRatingLoss),
)
def build_deeprecommender_train(
    size: Any, device: Any, dtype: torch.dtype
) -> tuple[nn.Module, tuple[Any, ...]]:
    """DeepRecommender autoencoder training step: masked MSE over existing ratings, dropout, SGD."""
    base = get("nvidia_deeprecommender")
    model, inputs = base.builder({**base.size(size["base_tier"]), **size["overrides"]}, device, dtype)
    return place(MaskedRatingLoss(model), device, dtype), inputs


def _generator_net(nz: int, ngf: int, side: int) -> nn.Sequential:
    ups = int(math.log2(side)) - 2  # 4x4 after the first layer, doubled by each further one
    width = ngf * 2 ** (ups - 1)
    layers: list[nn.Module] = [
        nn.ConvTranspose2d(nz, width, 4, 1, 0, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    for _ in range(ups - 1):
        layers += [
            nn.ConvTranspose2d(width, width // 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(width // 2),
            nn.ReLU(),
        ]
        width //= 2
    return nn.Sequential(*layers, nn.ConvTranspose2d(width, 3, 4, 2, 1, bias=False), nn.Tanh())


def _discriminator_net(ndf: int, side: int) -> nn.Sequential:
    downs = int(math.log2(side)) - 2
    layers: list[nn.Module] = [nn.Conv2d(3, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2)]
    width = ndf
    for _ in range(downs - 1):
        layers += [
            nn.Conv2d(width, width * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(width * 2),
            nn.LeakyReLU(0.2),
        ]
        width *= 2
    return nn.Sequential(*layers, nn.Conv2d(width, 1, 4, 1, 0, bias=False), nn.Flatten())


class DCGANStep(TrainingModel):
    """Discriminator loss on real and (detached) fake images plus the generator's non-saturating loss
    through a discriminator with detached parameters: one backward, each network its own gradients."""

    def __init__(self, nz: int, ngf: int, ndf: int, side: int) -> None:
        super().__init__()
        self.generator = _generator_net(nz, ngf, side)
        self.discriminator = _discriminator_net(ndf, side)
        self.optimizer_spec = DCGAN_ADAM

    def forward(self, noise: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        fake = self.generator(noise)
        d_real = self.discriminator(real)
        d_fake = self.discriminator(fake.detach())
        loss_d = F.binary_cross_entropy_with_logits(
            d_real, torch.ones_like(d_real)
        ) + F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
        frozen = {name: p.detach() for name, p in self.discriminator.named_parameters()}
        g_logits = torch.func.functional_call(self.discriminator, frozen, (fake,))
        loss_g = F.binary_cross_entropy_with_logits(g_logits, torch.ones_like(g_logits))
        return loss_d + loss_g


@workload(
    "dcgan_train",
    sizes={
        "smoke": {"batch": 4, "nz": 8, "ngf": 4, "ndf": 4, "side": 16},
        "standard": {"batch": 32, "nz": 100, "ngf": 64, "ndf": 64, "side": 64},
        "full": {"batch": 128, "nz": 100, "ngf": 64, "ndf": 64, "side": 64},
    },
    tags=(Tag.TRAINING, Tag.VISION, Tag.VENDOR, Tag.LAUNCH_BOUND),
    code=(DCGANStep, _generator_net, _discriminator_net, OptimizerSpec),
)
def build_dcgan_train(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """DCGAN-style GAN training step (generator and discriminator updated together, Adam)."""
    seed_weights()
    model = DCGANStep(size["nz"], size["ngf"], size["ndf"], size["side"])
    gen = generator()
    noise = randn((size["batch"], size["nz"], 1, 1), device, dtype, gen)
    real = randn((size["batch"], 3, size["side"], size["side"]), device, dtype, gen).clamp(-1.0, 1.0)
    return place(model, device, dtype), (noise, real)
