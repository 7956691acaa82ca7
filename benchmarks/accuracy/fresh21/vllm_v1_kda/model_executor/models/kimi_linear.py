"""Inference-only Kimi Linear (vllm/model_executor/models/kimi_linear.py).

KDA layers and full-attention layers, 3:1 in the released model (2:1 here). The KDA layers
keep a ReplaySSM pool each; the attention layers a paged KV cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm_v1_kda.attention.layer import Attention
from vllm_v1_kda.config import (
    CacheConfig,
    KimiLinearConfig,
    LoadConfig,
    ModelConfig,
    VllmConfig,
    tiny_vllm_config,
)
from vllm_v1_kda.model_executor.layers.kda import KimiDeltaAttention
from vllm_v1_kda.model_executor.layers.mamba.mamba_utils import (
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
)
from vllm_v1_kda.model_executor.model_loader.weight_utils import default_weight_loader
from vllm_v1_kda.utils import maybe_prefix


class KimiRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        orig_dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (x * self.weight.float()).to(orig_dtype)


class KimiMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, prefix: str = "") -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class KimiAttention(nn.Module):
    """The full-attention layers (MLA in the released model; plain GQA here)."""

    def __init__(self, config: KimiLinearConfig, cache_config: Optional[CacheConfig], prefix: str = "") -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            num_kv_heads=self.num_kv_heads,
            cache_config=cache_config,
            prefix=f"{prefix}.attn",
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        return self.o_proj(self.attn(q, k, v))


class KimiDecoderLayer(nn.Module):
    def __init__(
        self,
        config: KimiLinearConfig,
        layer_idx: int,
        model_config: ModelConfig,
        cache_config: Optional[CacheConfig],
        prefix: str = "",
        force_kda: bool = False,
    ) -> None:
        super().__init__()
        self.is_kda = force_kda or config.is_kda_layer(layer_idx)
        if self.is_kda:
            self.self_attn = KimiDeltaAttention(
                layer_idx,
                config.hidden_size,
                config,
                cache_config=cache_config,
                model_config=model_config,
                prefix=f"{prefix}.self_attn",
            )
        else:
            self.self_attn = KimiAttention(config, cache_config, prefix=f"{prefix}.self_attn")
        self.mlp = KimiMLP(config.hidden_size, config.intermediate_size, prefix=f"{prefix}.mlp")
        self.input_layernorm = KimiRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = KimiRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        if self.is_kda:
            attn_output = torch.zeros_like(hidden_states)
            self.self_attn(hidden_states, attn_output)
        else:
            attn_output = self.self_attn(positions, hidden_states)
        hidden_states = residual + attn_output
        residual = hidden_states
        return residual + self.mlp(self.post_attention_layernorm(hidden_states))


class KimiLinearModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str = "") -> None:
        super().__init__()
        config = model_config.hf_config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            KimiDecoderLayer(
                config,
                layer_idx,
                model_config,
                vllm_config.cache_config,
                prefix=f"{prefix}.layers.{layer_idx}",
            )
            for layer_idx in range(config.num_hidden_layers)
        )
        self.norm = KimiRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden_states = layer(positions, hidden_states)
        return self.norm(hidden_states)


class KimiLinearForCausalLM(nn.Module):
    is_hybrid = True
    has_inner_state = True

    def __init__(self, *, vllm_config: VllmConfig, model_config: Optional[ModelConfig] = None, prefix: str = "") -> None:
        super().__init__()
        model_config = model_config or vllm_config.model_config
        self.config = model_config.hf_config
        self.model = KimiLinearModel(
            vllm_config=vllm_config, model_config=model_config, prefix=maybe_prefix(prefix, "model")
        )
        self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states).float()

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig) -> tuple[torch.dtype, ...]:
        return MambaStateDtypeCalculator.kda_replay_state_dtype(
            vllm_config.model_config.dtype,
            vllm_config.cache_config.mamba_cache_dtype,
            vllm_config.cache_config.mamba_ssm_cache_dtype,
        )

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig) -> tuple[tuple[int, ...], ...]:
        lin = vllm_config.model_config.hf_config.linear_attn_config
        return MambaStateShapeCalculator.kda_replay_state_shape(
            vllm_config.parallel_config.tensor_parallel_size,
            lin["num_heads"],
            lin.get("num_v_heads", lin["num_heads"]),
            lin["head_dim"],
            lin.get("head_v_dim", lin["head_dim"]),
            vllm_config.cache_config.kda_ring_len,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params_dict = dict(self.named_parameters())
        loaded_params: set[str] = set()
        for name, loaded_weight in weights:
            if name.startswith("model.layers.") and int(name.split(".")[2]) >= self.config.num_hidden_layers:
                # MTP layers are loaded by the drafter
                continue
            if name not in params_dict:
                continue
            param = params_dict[name]
            weight_loader = getattr(param, "weight_loader", default_weight_loader)
            weight_loader(param, loaded_weight)
            loaded_params.add(name)
        return loaded_params


def save_dummy_checkpoint(model_dir: str, dtype: torch.dtype = torch.bfloat16) -> str:
    """Writes a random Kimi Linear checkpoint (``pytorch_model.bin``, every tensor in ``dtype``)."""
    from vllm_v1_kda.model_executor.model_loader import get_model

    vllm_config = tiny_vllm_config(dtype="float32")
    model = get_model(vllm_config=vllm_config)
    state_dict = {name: tensor.to(dtype) for name, tensor in model.state_dict().items()}
    path = os.path.join(model_dir, "pytorch_model.bin")
    torch.save(state_dict, path)
    return path


def build_kimi_linear_from_checkpoint(tmp_dir: str):
    """A bf16 checkpoint loaded by the default loader, and one replay pool per KDA layer
    allocated from the layers' specs."""
    from vllm_v1_kda.model_executor.model_loader import get_model

    save_dummy_checkpoint(tmp_dir)
    vllm_config = tiny_vllm_config(load_format="pt", model=tmp_dir)
    vllm_config.load_config = LoadConfig(load_format="pt", download_dir=tmp_dir)
    model = get_model(vllm_config=vllm_config)
    model = model.to(device=vllm_config.device_config.device)
    caches = {}
    for layer_name, layer in vllm_config.compilation_config.static_forward_context.items():
        if not isinstance(layer, KimiDeltaAttention):
            continue
        spec = layer.get_kv_cache_spec()
        caches[layer_name] = dict(
            zip(
                ("state", "d_cache", "k_cache", "g_cache"),
                (torch.zeros((2, *shape), dtype=dtype) for shape, dtype in zip(spec.shapes, spec.dtypes)),
            )
        )
    return {"model": model, "replay_pools": caches}
