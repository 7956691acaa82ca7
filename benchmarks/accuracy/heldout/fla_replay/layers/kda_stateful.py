"""A stateful wrapper for batch-1 streaming: the layer owns its ring buffers."""

import torch
from torch import nn

from .kda import KimiDeltaAttention


class StreamingKDA(nn.Module):
    def __init__(self, ring: int = 4) -> None:
        super().__init__()
        self.attn = KimiDeltaAttention()
        shape = (1, self.attn.num_v_heads, ring, self.attn.head_dim)
        self.register_buffer("d_ring", torch.zeros(shape), persistent=False)
        self.register_buffer("g_ring", torch.zeros(shape, dtype=torch.float32), persistent=False)


class StreamingKDAFp32Ring(StreamingKDA):
    def type(self, dst_type):  # type: ignore[no-untyped-def, override]
        g_ring = self.g_ring
        super().type(dst_type)
        self.g_ring = g_ring
        return self


def streaming_layer(fp32_ring: bool) -> StreamingKDA:
    if fp32_ring:
        return StreamingKDAFp32Ring().type(torch.bfloat16)
    layer = StreamingKDA()
    layer.type(torch.bfloat16)  # expect-bug: module-cast
    return layer


def build_streaming_layer() -> dict[str, torch.Tensor]:
    return dict(streaming_layer(fp32_ring=False).named_buffers())


def build_streaming_layer_fp32_ring() -> dict[str, torch.Tensor]:
    return dict(streaming_layer(fp32_ring=True).named_buffers())
