"""Hugging Face transformers models from the paper's list, built from configs with random weights.

Nothing is downloaded: each builder makes a config object, instantiates the model class with seeded
random weights and draws token ids. Sizes: ``smoke`` shrinks every dimension (a CPU runs it in well
under a second), ``standard`` keeps each model's real widths with a few layers (as measured in DESIGN.md
4), ``full`` is the published architecture.

Configs set ``use_cache=False`` (and XLNet's ``use_mems_eval=False``) so outputs are logits only, and
keep special token ids inside small vocabularies. Every import of ``transformers`` happens inside a
builder and turns into ``WorkloadUnavailable`` when it fails.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from suites.workloads.common import generator, import_optional, place, randint, seed_weights
from suites.workloads.registry import Tag, WorkloadUnavailable, workload


def hf_model(model_class: str, config_class: str, config: dict[str, Any]) -> nn.Module:
    """Instantiate ``transformers.<model_class>(<config_class>(**config))`` with seeded weights."""
    transformers = import_optional("transformers")
    try:
        config_type = getattr(transformers, config_class)
        model_type = getattr(transformers, model_class)
    except Exception as exc:  # lazy module imports fail here (e.g. a broken optional dependency)
        raise WorkloadUnavailable("transformers", exc) from exc
    seed_weights()
    try:
        return model_type(config_type(**config))
    except (ImportError, NameError) as exc:  # transformers' stand-in for a model whose torch is too old
        raise WorkloadUnavailable("transformers", exc) from exc


def special_tokens(vocab: int) -> dict[str, int]:
    return {"pad_token_id": 0, "bos_token_id": 1 % vocab, "eos_token_id": 2 % vocab}


def token_ids(batch: int, seq: int, vocab: int, device: Any, gen: torch.Generator) -> torch.Tensor:
    return 3 + randint((batch, seq), max(vocab - 3, 1), device, gen)  # avoid pad/bos/eos


def _encoder_only(model_class: str, config_class: str, config: dict[str, Any]) -> Any:
    def build(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
        model = hf_model(model_class, config_class, {**config, **size["config"]})
        vocab = {**config, **size["config"]}["vocab_size"]
        ids = token_ids(size["batch"], size["seq"], vocab, device, generator())
        return place(model, device, dtype), (ids,)

    return build


def _encoder_decoder(model_class: str, config_class: str, config: dict[str, Any]) -> Any:
    def build(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
        merged = {**config, **size["config"]}
        model = hf_model(model_class, config_class, merged)
        gen = generator()
        ids = token_ids(size["batch"], size["seq"], merged["vocab_size"], device, gen)
        decoder_ids = token_ids(size["batch"], size["decoder_seq"], merged["vocab_size"], device, gen)
        return place(_Seq2Seq(model), device, dtype), (ids, decoder_ids)

    return build


class _Seq2Seq(nn.Module):
    """Calls an encoder-decoder with keyword arguments, so the suites can pass positional inputs."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> Any:
        return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids)


def _tiers(
    smoke: dict[str, Any], standard: dict[str, Any], full: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    return {"smoke": smoke, "standard": standard, "full": full}


def _register(name: str, build: Any, sizes: dict[str, Any], tags: tuple[Tag, ...], doc: str) -> None:
    build.__doc__ = doc
    workload(
        name,
        sizes=sizes,
        tags=(Tag.TRANSFORMER, *tags),
        requires=("transformers",),
        code=(hf_model, token_ids),
    )(build)


_SMALL = {"num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": 32, "intermediate_size": 64}

_register(
    "XLNetLMHeadModel",
    _encoder_only(
        "XLNetLMHeadModel",
        "XLNetConfig",
        {"use_mems_eval": False, "mem_len": None, "use_cache": False, **special_tokens(32000)},
    ),
    _tiers(
        {
            "batch": 1,
            "seq": 16,
            "config": {"vocab_size": 256, "d_model": 32, "n_layer": 1, "n_head": 2, "d_inner": 64},
        },
        {
            "batch": 1,
            "seq": 128,
            "config": {"vocab_size": 32000, "d_model": 1024, "n_layer": 4, "n_head": 16, "d_inner": 4096},
        },
        {
            "batch": 8,
            "seq": 512,
            "config": {"vocab_size": 32000, "d_model": 1024, "n_layer": 24, "n_head": 16, "d_inner": 4096},
        },
    ),
    (Tag.CGCT, Tag.LAUNCH_BOUND),
    "XLNet language model (relative positions are built with arange, partly on the CPU).",
)

_register(
    "MT5ForConditionalGeneration",
    _encoder_decoder(
        "MT5ForConditionalGeneration",
        "MT5Config",
        {
            "use_cache": False,
            "feed_forward_proj": "gated-gelu",
            "tie_word_embeddings": False,
            "decoder_start_token_id": 0,
            **special_tokens(250112),
        },
    ),
    _tiers(
        {
            "batch": 1,
            "seq": 16,
            "decoder_seq": 8,
            "config": {
                "vocab_size": 256,
                "d_model": 32,
                "d_kv": 16,
                "d_ff": 64,
                "num_layers": 1,
                "num_decoder_layers": 1,
                "num_heads": 2,
            },
        },
        {
            "batch": 4,
            "seq": 64,
            "decoder_seq": 64,
            "config": {
                "vocab_size": 250112,
                "d_model": 512,
                "d_kv": 64,
                "d_ff": 1024,
                "num_layers": 2,
                "num_decoder_layers": 2,
                "num_heads": 6,
            },
        },
        {
            "batch": 8,
            "seq": 512,
            "decoder_seq": 128,
            "config": {
                "vocab_size": 250112,
                "d_model": 512,
                "d_kv": 64,
                "d_ff": 1024,
                "num_layers": 8,
                "num_decoder_layers": 8,
                "num_heads": 6,
            },
        },
    ),
    (Tag.GRAPH_BREAK, Tag.LAUNCH_BOUND),
    "mT5 encoder-decoder (Dynamo splits it into several graphs).",
)

_register(
    "MobileBertForQuestionAnswering",
    _encoder_only("MobileBertForQuestionAnswering", "MobileBertConfig", {**special_tokens(30522)}),
    _tiers(
        {
            "batch": 1,
            "seq": 16,
            "config": {
                "vocab_size": 256,
                "hidden_size": 64,
                "embedding_size": 32,
                "intra_bottleneck_size": 32,
                "true_hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_feedforward_networks": 2,
            },
        },
        {"batch": 1, "seq": 128, "config": {"vocab_size": 30522, "num_hidden_layers": 4}},
        {"batch": 8, "seq": 384, "config": {"vocab_size": 30522, "num_hidden_layers": 24}},
    ),
    (Tag.LAUNCH_BOUND,),
    "MobileBERT question answering (many tiny kernels per layer).",
)

# the published deberta-v2-xlarge attention settings (the config class defaults differ between versions)
_DEBERTA_V2 = {
    "relative_attention": True,
    "pos_att_type": ["p2c", "c2p"],
    "position_biased_input": False,
    "max_relative_positions": -1,
    "position_buckets": 256,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "hidden_size": 1536,
    "num_attention_heads": 24,
    "intermediate_size": 6144,
    **special_tokens(128100),
}
_register(
    "DebertaV2ForQuestionAnswering",
    _encoder_only("DebertaV2ForQuestionAnswering", "DebertaV2Config", _DEBERTA_V2),
    _tiers(
        {"batch": 1, "seq": 16, "config": {"vocab_size": 256, **_SMALL, "position_buckets": 8}},
        {"batch": 1, "seq": 128, "config": {"vocab_size": 128100, "num_hidden_layers": 4}},
        {"batch": 8, "seq": 512, "config": {"vocab_size": 128100, "num_hidden_layers": 24}},
    ),
    (Tag.CGCT, Tag.LAUNCH_BOUND),
    "DeBERTa-v2 question answering (scales attention with a tensor made on the CPU).",
)

_DEBERTA = {
    "relative_attention": True,
    "pos_att_type": ["c2p", "p2c"],
    "position_biased_input": False,
    "max_relative_positions": -1,
    **special_tokens(50265),
}
_register(
    "DebertaForQuestionAnswering",
    _encoder_only("DebertaForQuestionAnswering", "DebertaConfig", _DEBERTA),
    _tiers(
        {"batch": 1, "seq": 16, "config": {"vocab_size": 256, **_SMALL}},
        {"batch": 1, "seq": 128, "config": {"vocab_size": 50265, "num_hidden_layers": 4}},
        {"batch": 8, "seq": 512, "config": {"vocab_size": 50265, "num_hidden_layers": 12}},
    ),
    (Tag.CGCT, Tag.LAUNCH_BOUND),
    "DeBERTa question answering with disentangled relative attention.",
)

_register(
    "BlenderbotSmallForConditionalGeneration",
    _encoder_decoder(
        "BlenderbotSmallForConditionalGeneration",
        "BlenderbotSmallConfig",
        {"use_cache": False, "decoder_start_token_id": 1, **special_tokens(54944)},
    ),
    _tiers(
        {
            "batch": 1,
            "seq": 16,
            "decoder_seq": 8,
            "config": {
                "vocab_size": 256,
                "d_model": 32,
                "encoder_layers": 1,
                "decoder_layers": 1,
                "encoder_attention_heads": 2,
                "decoder_attention_heads": 2,
                "encoder_ffn_dim": 64,
                "decoder_ffn_dim": 64,
                "max_position_embeddings": 64,
            },
        },
        {
            "batch": 2,
            "seq": 128,
            "decoder_seq": 64,
            "config": {"vocab_size": 54944, "encoder_layers": 2, "decoder_layers": 2},
        },
        {"batch": 8, "seq": 256, "decoder_seq": 128, "config": {"vocab_size": 54944}},
    ),
    (Tag.LAUNCH_BOUND,),
    "BlenderbotSmall encoder-decoder.",
)

_register(
    "DistilGPT2",
    _encoder_only("GPT2LMHeadModel", "GPT2Config", {"use_cache": False, **special_tokens(50257)}),
    _tiers(
        {
            "batch": 1,
            "seq": 16,
            "config": {"vocab_size": 256, "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 64},
        },
        {
            "batch": 1,
            "seq": 128,
            "config": {"vocab_size": 50257, "n_embd": 768, "n_layer": 6, "n_head": 12, "n_positions": 1024},
        },
        {
            "batch": 16,
            "seq": 512,
            "config": {"vocab_size": 50257, "n_embd": 768, "n_layer": 6, "n_head": 12, "n_positions": 1024},
        },
    ),
    (Tag.LAUNCH_BOUND,),
    "GPT-2 language model with a distilgpt2-like config (6 layers).",
)
