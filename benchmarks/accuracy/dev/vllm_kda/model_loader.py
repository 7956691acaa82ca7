"""Builds the model under the model dtype (vLLM's default loader) and its spec-decode helpers."""

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from .cache import HEAD_K, HEAD_V, RING, VALUE_HEADS
from .config import CacheConfig
from .layer import KimiDeltaAttention


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    yield
    torch.set_default_dtype(old_dtype)


class KimiLinearForCausalLM(nn.Module):
    def __init__(self, cache_config: CacheConfig, model_dtype: torch.dtype, num_layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [KimiDeltaAttention(cache_config, model_dtype, prefix=f"model.layers.{i}.self_attn") for i in range(num_layers)]
        )
        # CUDA-graph padding rows decode into this scratch slot instead of a real one.
        self.padding_d_cache = torch.zeros(1, VALUE_HEADS, RING, HEAD_V)
        self.padding_g_cache = torch.zeros(1, VALUE_HEADS, RING, HEAD_K)  # expect-bug: default-dtype
        self.padding_write_pos = torch.zeros(1, dtype=torch.int32)


class KimiLinearForCausalLMFp32Padding(KimiLinearForCausalLM):
    def __init__(self, cache_config: CacheConfig, model_dtype: torch.dtype, num_layers: int = 2) -> None:
        super().__init__(cache_config, model_dtype, num_layers)
        self.padding_g_cache = torch.zeros(1, VALUE_HEADS, RING, HEAD_K, dtype=torch.float32)


def initialize_model(cache_config: CacheConfig, model_dtype: torch.dtype, fp32_padding: bool = False) -> KimiLinearForCausalLM:
    model_class = KimiLinearForCausalLMFp32Padding if fp32_padding else KimiLinearForCausalLM
    with set_default_torch_dtype(model_dtype):
        model = model_class(cache_config, model_dtype)
    return model


def speculative_gate_prefix(g_ring: torch.Tensor, draft_g: torch.Tensor, slot: int) -> torch.Tensor:
    """Gate prefix sums over the draft tokens, offset by the slot's accumulated log-decay."""
    offset = g_ring[slot].sum(dim=1, keepdim=True)
    spec_g_cache = offset + draft_g.cumsum(dim=1)
    return spec_g_cache


def speculative_gate_prefix_scalar_offset(g_ring: torch.Tensor, draft_g: torch.Tensor, slot: int) -> torch.Tensor:
    offset = float(g_ring[slot].sum())
    spec_g_cache = draft_g.cumsum(dim=1) + offset  # expect-bug: promotion
    return spec_g_cache


def _model_buffers(model: KimiLinearForCausalLM) -> dict[str, torch.Tensor]:
    return {
        "padding_d_cache": model.padding_d_cache,
        "padding_g_cache": model.padding_g_cache,
        "padding_write_pos": model.padding_write_pos,
        "A_log": model.layers[0].A_log,
    }


def build_initialized_model_bf16() -> dict[str, torch.Tensor]:
    return _model_buffers(initialize_model(CacheConfig(), torch.bfloat16))


def build_initialized_model_fp32_padding() -> dict[str, torch.Tensor]:
    return _model_buffers(initialize_model(CacheConfig(), torch.bfloat16, fp32_padding=True))


def _draft() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    g_ring = -torch.rand(3, VALUE_HEADS, RING, HEAD_K)
    draft_g = (-torch.rand(VALUE_HEADS, 2, HEAD_K)).to(torch.bfloat16)
    return g_ring, draft_g


def build_speculative_prefix() -> dict[str, torch.Tensor]:
    return {"spec_g_cache": speculative_gate_prefix(*_draft(), slot=1)}


def build_speculative_prefix_scalar_offset() -> dict[str, torch.Tensor]:
    return {"spec_g_cache": speculative_gate_prefix_scalar_offset(*_draft(), slot=1)}
