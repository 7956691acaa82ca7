"""KDA layer of the hybrid model: decode reads the layer's bound state dict."""

from dataclasses import dataclass

import torch
from torch import nn

from .config import ModelConfig
from .kernels import fused_recurrent_kda_replayssm_decode, last_args


@dataclass
class LinearAttentionMetadata:
    num_decode_tokens: int
    state_indices: torch.Tensor
    ring_write_pos: torch.Tensor


class KimiDeltaAttention(nn.Module):
    def __init__(self, model_config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.model_config = model_config
        hv, dim = model_config.linear_num_value_heads, model_config.linear_head_dim
        self.A_log = nn.Parameter(torch.zeros(hv, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.zeros(hv, dim, dtype=torch.float32))
        self.kv_cache: list[dict[str, torch.Tensor]] = []

    def _decode_inputs(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.model_config
        dtype = cfg.dtype
        width = 2 * cfg.linear_num_heads * cfg.linear_head_dim + cfg.linear_num_value_heads * cfg.linear_head_dim
        mixed_qkv = torch.randn(n, width, dtype=dtype)
        a = torch.randn(n, cfg.linear_num_value_heads, cfg.linear_head_dim, dtype=dtype)
        b = torch.randn(n, cfg.linear_num_value_heads, dtype=dtype)
        out = torch.empty(n, 1, cfg.linear_num_value_heads, cfg.linear_head_dim, dtype=dtype)
        return mixed_qkv, a, b, out

    def _decode(self, state: dict[str, torch.Tensor], log_decay_ring: torch.Tensor, meta: LinearAttentionMetadata) -> torch.Tensor:
        mixed_qkv, a, b, out = self._decode_inputs(meta.num_decode_tokens)
        fused_recurrent_kda_replayssm_decode(
            mixed_qkv=mixed_qkv,
            a=a,
            b=b,
            A_log=self.A_log,
            dt_bias=self.dt_bias,
            scale=self.model_config.linear_head_dim**-0.5,
            initial_state=state["ssm_state"],
            d_cache=state["d_ring"],
            k_cache=state["k_ring"],
            g_cache=log_decay_ring,
            out=out,
            ssm_state_indices=meta.state_indices,
            write_pos=meta.ring_write_pos,
        )
        return out

    def forward_decode(self, meta: LinearAttentionMetadata, virtual_engine: int = 0) -> torch.Tensor:
        state = self.kv_cache[virtual_engine]
        return self._decode(state, state["log_decay_ring"], meta)

    def forward_decode_piecewise_graph(self, meta: LinearAttentionMetadata, virtual_engine: int = 0) -> torch.Tensor:
        # The piecewise graph was captured with every state input in the activation dtype.
        state = self.kv_cache[virtual_engine]
        log_decay_ring = state["log_decay_ring"].to(dtype=self.model_config.dtype)  # expect-bug: cast
        return self._decode(state, log_decay_ring, meta)


def profile_run_state(model_config: ModelConfig, num_slots: int, ring: int) -> dict[str, torch.Tensor]:
    hv, h, dim = model_config.linear_num_value_heads, model_config.linear_num_heads, model_config.linear_head_dim
    ssm_state = torch.zeros(num_slots, hv, dim, dim, dtype=model_config.dtype)
    d_ring = torch.zeros(num_slots, hv, ring, dim, dtype=model_config.dtype)
    k_ring = torch.zeros(num_slots, h, ring, dim, dtype=model_config.dtype)
    log_decay_ring = torch.empty_like(d_ring).fill_(0.0)  # expect-bug: like
    return {"ssm_state": ssm_state, "d_ring": d_ring, "k_ring": k_ring, "log_decay_ring": log_decay_ring}


def profile_run_state_fp32_decay(model_config: ModelConfig, num_slots: int, ring: int) -> dict[str, torch.Tensor]:
    state = profile_run_state(model_config, num_slots, ring)
    state["log_decay_ring"] = torch.zeros_like(state["d_ring"], dtype=torch.float32)
    return state


def _meta() -> LinearAttentionMetadata:
    return LinearAttentionMetadata(2, torch.tensor([0, 2], dtype=torch.int32), torch.zeros(2, dtype=torch.int32))


def build_profile_state() -> dict[str, torch.Tensor]:
    return profile_run_state(ModelConfig(), 3, 4)


def build_profile_state_fp32_decay() -> dict[str, torch.Tensor]:
    return profile_run_state_fp32_decay(ModelConfig(), 3, 4)


def build_forward_decode() -> dict[str, torch.Tensor]:
    layer = KimiDeltaAttention(ModelConfig(), 0)
    layer.kv_cache = [profile_run_state_fp32_decay(ModelConfig(), 3, 4)]
    layer.forward_decode(_meta())
    return dict(last_args)


def build_forward_decode_piecewise() -> dict[str, torch.Tensor]:
    layer = KimiDeltaAttention(ModelConfig(), 0)
    layer.kv_cache = [profile_run_state_fp32_decay(ModelConfig(), 3, 4)]
    layer.forward_decode_piecewise_graph(_meta())
    return dict(last_args)
