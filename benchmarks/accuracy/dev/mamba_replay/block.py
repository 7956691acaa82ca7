"""A residual block that owns a single-sequence gate ring (for speculative draft heads)."""

import torch
from torch import nn

from .mixer import KDAMixer


class DraftBlock(nn.Module):
    def __init__(self, d_model: int = 8, ring_len: int = 4) -> None:
        super().__init__()
        self.mixer = KDAMixer(d_model, ring_len=ring_len, layer_idx=0)
        self.norm = nn.LayerNorm(d_model)
        nheads, headdim = self.mixer.nheads, self.mixer.headdim
        self.register_buffer("g_cache", torch.zeros(1, nheads, ring_len, headdim, dtype=torch.float32))
        self.register_buffer("step_idx", torch.zeros((), dtype=torch.long))


class DraftBlockKeepFp32(DraftBlock):
    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        super()._apply(fn, recurse)
        self.g_cache = self.g_cache.float()
        return self


def draft_head(dtype: torch.dtype, keep_fp32: bool) -> DraftBlock:
    block = DraftBlockKeepFp32() if keep_fp32 else DraftBlock()
    if keep_fp32:
        return block.to(dtype=dtype)
    return block.to(dtype=dtype)  # expect-bug: module-cast


def build_draft_head_bf16() -> dict[str, torch.Tensor]:
    return dict(draft_head(torch.bfloat16, keep_fp32=False).named_buffers())


def build_draft_head_keep_fp32() -> dict[str, torch.Tensor]:
    return dict(draft_head(torch.bfloat16, keep_fp32=True).named_buffers())


def build_draft_head_to_device() -> dict[str, torch.Tensor]:
    block = DraftBlock().to("cpu")
    return dict(block.named_buffers())
