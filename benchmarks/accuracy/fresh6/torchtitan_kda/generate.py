"""Generation script: greedy decoding with the model's rings or with an external cache."""

from __future__ import annotations

import torch
from torch import nn

from .config_manager import TORCH_DTYPE_MAP, JobConfig
from .models import KDAModelArgs
from .models.model import Transformer
from .ops import kda_replayssm_decode
from .parallelize import apply_mixed_precision_params, decode_state_dtype, materialize_model, mp_policy_from_config


class DecodeCache:
    """Rings of every layer for batched generation outside the model's own buffers."""

    def __init__(self, args: KDAModelArgs, batch_size: int, dtype: torch.dtype) -> None:
        self.dtype = dtype
        n, b, hv, d = args.n_layers, batch_size, args.n_v_heads, args.head_dim
        self.state = torch.zeros(n, b, hv, d, d, dtype=torch.float32)
        self.d_ring = torch.zeros(n, b, hv, args.ring_len, d, dtype=self.dtype)
        self.k_ring = torch.zeros(n, b, args.n_heads, args.ring_len, d, dtype=self.dtype)
        self.lg_ring = torch.zeros(n, b, hv, args.ring_len, d, dtype=self.dtype)  # expect-bug: pool-dtype
        self.pos = torch.zeros(b, dtype=torch.long)

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {"delta": self.d_ring.clone(), "forget_log": self.lg_ring.type_as(self.d_ring), "pos": self.pos.clone()}  # expect-bug: cast


@torch.no_grad()
def decode_with_cache(model: Transformer, tokens: torch.Tensor, cache: DecodeCache) -> torch.Tensor:
    h = model.tok_embeddings(tokens)
    rows = torch.arange(tokens.size(0))
    for i, layer in enumerate(model.layers.values()):
        attention, x = layer.attention, layer.attention_norm(h)
        out = torch.empty(x.size(0), model.args.n_v_heads, model.args.head_dim, dtype=x.dtype)
        qkv, a, b = attention.wqkv(x), attention.wa(x), attention.wb(x)
        kda_replayssm_decode(qkv, a, b, attention.A_log, attention.dt_bias, model.args.head_dim**-0.5, cache.state[i], cache.d_ring[i],
                             cache.k_ring[i], g_cache=cache.lg_ring[i], out=out, ssm_state_indices=rows, write_pos=cache.pos)
        h = h + attention.wo(out.flatten(1))
    cache.pos = (cache.pos + 1) % model.args.ring_len
    return model.output(model.norm(h))


def draft_rings(job_config: JobConfig, args: KDAModelArgs, batch_size: int) -> dict[str, torch.Tensor]:
    dtype = decode_state_dtype(job_config)  # expect-bug: imported-policy id=titan-decode-dtype
    shape = (batch_size, args.n_v_heads, args.ring_len, args.head_dim)
    lg_ring = torch.zeros(shape, dtype=dtype)  # expect-bug: imported-policy id=titan-decode-dtype
    return {"delta": torch.zeros(shape, dtype=dtype), "lg_ring": lg_ring}


def rollback_rings(args: KDAModelArgs, batch_size: int) -> dict[str, torch.Tensor]:
    """Rings that rejected draft steps are rolled back into (made in the current default dtype)."""
    shape = (batch_size, args.n_v_heads, args.ring_len, args.head_dim)
    return {"delta": torch.zeros(shape), "lg_ring": torch.zeros(shape)}  # expect-bug: default-dtype id=titan-gen-default


def prompt_gates(model: Transformer, prompt: torch.Tensor) -> torch.Tensor:
    """The log-decay rows of the prompt's last positions, laid out like ``lg_ring``."""
    h = model.tok_embeddings(prompt)
    args = model.args
    lg_ring = h.new_zeros(prompt.size(0), args.n_v_heads, args.ring_len, args.head_dim)  # expect-bug: like
    rings = model.layers["0"].attention.prefill(h)
    lg_ring.copy_(rings["forget_log"])
    return lg_ring


def prepare_speculative(job_config: JobConfig, args: KDAModelArgs, batch_size: int) -> dict[str, object]:
    torch.set_default_dtype(TORCH_DTYPE_MAP[job_config.generation.dtype])  # expect-bug: default-dtype id=titan-gen-default
    rollback = rollback_rings(args, batch_size)
    torch.set_default_dtype(torch.float32)
    return {"draft": draft_rings(job_config, args, batch_size), "rollback": rollback}


def export_for_serving(model: nn.Module, job_config: JobConfig) -> nn.Module:
    return model.to(TORCH_DTYPE_MAP[job_config.generation.dtype])  # expect-bug: module-cast


@torch.no_grad()
def main(job_config: JobConfig, prompt: torch.Tensor) -> dict[str, object]:
    model = materialize_model(job_config)
    apply_mixed_precision_params(model, mp_policy_from_config(job_config))
    tokens = []
    for step in range(prompt.size(1)):
        logits = model(prompt[:, step])
    for _ in range(job_config.generation.max_new_tokens):
        tokens.append(logits.argmax(-1))
        logits = model(tokens[-1])
    return {"tokens": torch.stack(tokens, 1), "model": model}


def build_generate() -> dict[str, object]:
    return main(JobConfig.from_dict({"generation": {"max_new_tokens": 2}}), torch.tensor([[1, 2, 3], [4, 5, 6]]))


def build_batched_cache() -> DecodeCache:
    job_config = JobConfig()
    model = apply_mixed_precision_params(materialize_model(job_config), mp_policy_from_config(job_config))
    cache = DecodeCache(model.args, 2, torch.bfloat16)
    for tokens in ([1, 2], [3, 4]):
        decode_with_cache(model, torch.tensor(tokens), cache)
    return cache
