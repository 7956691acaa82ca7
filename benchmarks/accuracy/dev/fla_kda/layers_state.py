"""A layer wrapper that owns a decode ring for batch-1 chat serving."""

import torch
from torch import nn

from .layer import KimiDeltaAttention


class KimiDeltaAttentionWithRing(nn.Module):
    def __init__(self, ring_len: int = 4) -> None:
        super().__init__()
        self.attn = KimiDeltaAttention(fp32_gate_ring=True)
        shape = (1, self.attn.num_v_heads, ring_len, self.attn.head_dim)
        self.register_buffer("d_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32), persistent=False)


class KimiDeltaAttentionWithFp32Ring(KimiDeltaAttentionWithRing):
    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        g_cache = self.g_cache
        super()._apply(fn, recurse)
        self.g_cache = g_cache.to(device=self.d_cache.device)
        return self


def chat_layer(dtype: torch.dtype) -> KimiDeltaAttentionWithRing:
    layer = KimiDeltaAttentionWithRing()
    layer = layer.to(dtype)  # expect-bug: module-cast
    return layer


def chat_layer_fp32_ring(dtype: torch.dtype) -> KimiDeltaAttentionWithRing:
    layer = KimiDeltaAttentionWithFp32Ring()
    layer = layer.to(dtype)
    return layer


def build_chat_layer() -> dict[str, torch.Tensor]:
    return dict(chat_layer(torch.bfloat16).named_buffers())


def build_chat_layer_fp32_ring() -> dict[str, torch.Tensor]:
    return dict(chat_layer_fp32_ring(torch.bfloat16).named_buffers())
