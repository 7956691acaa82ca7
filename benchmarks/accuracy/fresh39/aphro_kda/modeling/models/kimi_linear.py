"""Kimi Linear (hybrid KDA) for causal LM, inference only."""
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn

from ...common.config import CacheConfig, KDAShapes
from ...common.logger import init_logger
from ..layers.kda import KimiDeltaAttention
from ..layers.quantization import QuantizationConfig

logger = init_logger(__name__)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.float() * xf).to(x.dtype)


class KDAStateCache(nn.Module):
    """Model-owned ReplaySSM cache of one layer (``--in-model-cache``), in the style of the Jamba
    Mamba cache: buffers, so that the model's ``.to(device)`` moves them."""

    def __init__(self, shapes: KDAShapes, num_slots: int, ring_dtype: torch.dtype) -> None:
        super().__init__()
        self.ring_len = shapes.ring_len
        self.register_buffer("ssm_state", torch.zeros(num_slots, *shapes.ssm_state, dtype=torch.float32))
        self.register_buffer("delta_cache", torch.zeros(num_slots, *shapes.delta_cache, dtype=ring_dtype))
        self.register_buffer("key_cache", torch.zeros(num_slots, *shapes.key_cache, dtype=ring_dtype))
        self.register_buffer("alpha_log_cache", torch.zeros(num_slots, *shapes.alpha_log_cache))  # expect-bug: default-dtype id=owned-default

    def kernel_kwargs(self) -> Dict[str, torch.Tensor]:
        return {"initial_state": self.ssm_state, "d_cache": self.delta_cache, "k_cache": self.key_cache, "g_cache": self.alpha_log_cache}


class KimiMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


class KimiDecoderLayer(nn.Module):
    def __init__(self, config: Dict[str, Any], layer_idx: int, quant_config: Optional[QuantizationConfig] = None, prefix: str = "") -> None:
        super().__init__()
        la, hidden = config["linear_attn_config"], config["hidden_size"]
        self.input_layernorm = RMSNorm(hidden, config.get("rms_norm_eps", 1e-6))
        self.self_attn = KimiDeltaAttention(
            hidden, la["num_heads"], la["num_v_heads"], la["head_dim"], la["v_head_dim"], layer_idx=layer_idx,
            gate_lower_bound=la.get("gate_lower_bound"), quant_config=quant_config, prefix=f"{prefix}.self_attn",
        )
        self.post_attention_layernorm = RMSNorm(hidden, config.get("rms_norm_eps", 1e-6))
        self.mlp = KimiMLP(hidden, config["intermediate_size"])

    def forward(self, h: torch.Tensor, ssm_state_indices: torch.Tensor, write_pos: torch.Tensor, **rings: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), ssm_state_indices, write_pos, **rings)
        return h + self.mlp(self.post_attention_layernorm(h))


class KimiLinearForCausalLM(nn.Module):
    keep_fp32_buffers: Tuple[str, ...] = ("ssm_state", "alpha_log_cache")
    packed_modules_mapping = {"gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(
        self,
        config: Dict[str, Any],
        cache_config: Optional[CacheConfig] = None,
        quant_config: Optional[QuantizationConfig] = None,
        max_num_seqs: int = 8,
    ) -> None:
        super().__init__()
        self.config = config
        self.quant_config = quant_config
        self.embed_tokens = nn.Embedding(config["vocab_size"], config["hidden_size"])
        self.layers = nn.ModuleList(
            KimiDecoderLayer(config, i, quant_config, prefix=f"model.layers.{i}") for i in range(config["num_hidden_layers"])
        )
        self.norm = RMSNorm(config["hidden_size"], config.get("rms_norm_eps", 1e-6))
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)
        self.state_caches: Optional[nn.ModuleList] = None
        if cache_config is not None and cache_config.in_model_cache:
            la = config["linear_attn_config"]
            shapes = KDAShapes(la["num_heads"], la["num_v_heads"], la["head_dim"], la["v_head_dim"], cache_config.replay_ring_len)
            ring_dtype = self.embed_tokens.weight.dtype
            self.state_caches = nn.ModuleList(KDAStateCache(shapes, max_num_seqs, ring_dtype) for _ in self.layers)
        self.requires_grad_(False)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(
        self,
        input_ids: torch.Tensor,
        kv_caches: List[Dict[str, torch.Tensor]],
        ssm_state_indices: torch.Tensor,
        write_pos: torch.Tensor,
    ) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            rings = kv_caches[i] if kv_caches else self.state_caches[i].kernel_kwargs()
            h = layer(h, ssm_state_indices, write_pos, **rings)
        return self.norm(h)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states).float()

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        for name, loaded_weight in weights:
            name = name.removeprefix("model.")
            for packed, shards in self.packed_modules_mapping.items():
                shard_id = next((i for i, shard in enumerate(shards) if f".{shard}." in name), None)
                if shard_id is None:
                    continue
                param = params[name.replace(shards[shard_id], packed)]
                size = param.shape[0] // len(shards)
                param.data[shard_id * size:(shard_id + 1) * size].copy_(loaded_weight)
                break
            else:
                if name not in params:
                    logger.warning("Skipping weight %s not present in the model", name)
                    continue
                params[name].data.copy_(loaded_weight)
