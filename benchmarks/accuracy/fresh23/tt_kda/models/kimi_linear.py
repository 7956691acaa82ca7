# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Kimi Linear: component builder, model builders and HF weight conversion.

The component builder exposes every architectural knob; the model builders fix them for a
given checkpoint. Only the KDA layers are modelled here.
"""

import re
from typing import Dict, Optional

import torch
from torch import nn

from tt_kda.modules import (
    FeedForward,
    KimiDeltaAttention,
    RMSNorm,
    TransformerDecoder,
    TransformerSelfAttentionLayer,
)


def kimi_linear(
    *,
    vocab_size: int,
    num_layers: int,
    embed_dim: int,
    num_heads: int,
    num_v_heads: int,
    head_dim: int,
    v_head_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    ring_len: int = 64,
    norm_eps: float = 1e-5,
    lower_bound: Optional[float] = None,
) -> TransformerDecoder:
    """Builds a Kimi Linear decoder.

    Returns:
        TransformerDecoder: the model, without decode caches (see ``setup_caches``).
    """
    layers = []
    for _ in range(num_layers):
        attn = KimiDeltaAttention(
            embed_dim=embed_dim,
            num_heads=num_heads,
            num_v_heads=num_v_heads,
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            ring_len=ring_len,
            norm_eps=norm_eps,
            lower_bound=lower_bound,
        )
        layers.append(
            TransformerSelfAttentionLayer(
                attn=attn,
                mlp=FeedForward(embed_dim, intermediate_dim),
                sa_norm=RMSNorm(embed_dim, eps=norm_eps),
                mlp_norm=RMSNorm(embed_dim, eps=norm_eps),
            )
        )
    return TransformerDecoder(
        tok_embeddings=nn.Embedding(vocab_size, embed_dim),
        layers=layers,
        max_seq_len=max_seq_len,
        norm=RMSNorm(embed_dim, eps=norm_eps),
        output=nn.Linear(embed_dim, vocab_size, bias=False),
    )


def kimi_linear_tiny() -> TransformerDecoder:
    """A two-layer Kimi Linear model for tests and examples."""
    return kimi_linear(
        vocab_size=64,
        num_layers=2,
        embed_dim=32,
        num_heads=2,
        num_v_heads=4,
        head_dim=8,
        v_head_dim=8,
        intermediate_dim=64,
        max_seq_len=128,
        ring_len=4,
    )


_FROM_HF = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.scale",
    "lm_head.weight": "output.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.sa_norm.scale",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.mlp_norm.scale",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attn.q_proj.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attn.k_proj.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attn.v_proj.weight",
    "model.layers.{}.self_attn.f_a_proj.weight": "layers.{}.attn.f_proj.weight",
    "model.layers.{}.self_attn.b_proj.weight": "layers.{}.attn.b_proj.weight",
    "model.layers.{}.self_attn.A_log": "layers.{}.attn.A_log",
    "model.layers.{}.self_attn.dt_bias": "layers.{}.attn.dt_bias",
    "model.layers.{}.self_attn.o_norm.weight": "layers.{}.attn.o_norm.scale",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attn.o_proj.weight",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.mlp.w1.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.mlp.w2.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.mlp.w3.weight",
}
_TO_HF = {tune: hf for hf, tune in _FROM_HF.items()}
_LAYER_NUMBER = re.compile(r"\.(\d+)\.")


def get_mapped_key(key: str, mapping: Dict[str, str]) -> str:
    """Maps one key, abstracting its layer number (``layers.3.`` -> ``layers.{}.``)."""
    match = _LAYER_NUMBER.search(key)
    if match is None:
        return mapping[key]
    abstract = key[: match.start()] + ".{}." + key[match.end() :]
    return mapping[abstract].format(match.group(1))


def kimi_linear_hf_to_tune(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """HF key layout -> this package's layout (values unchanged)."""
    return {get_mapped_key(key, _FROM_HF): value for key, value in state_dict.items()}


def kimi_linear_tune_to_hf(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """This package's key layout -> HF layout (values unchanged)."""
    return {get_mapped_key(key, _TO_HF): value for key, value in state_dict.items()}


def build_kimi_linear_tiny_bf16() -> Dict[str, object]:
    """The tiny model cast to bf16, then given decode caches and run on a short prompt."""
    torch.manual_seed(0)
    model = kimi_linear_tiny().to(torch.bfloat16)
    model.setup_caches(batch_size=2, dtype=torch.bfloat16, decoder_max_seq_len=16)
    with torch.no_grad():
        logits = model(torch.randint(0, 64, (2, 6)))
    return {"model": model, "logits": logits}
