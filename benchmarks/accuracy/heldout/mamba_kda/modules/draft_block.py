"""A draft-head block that keeps its own decay ring for single-sequence speculation."""

import torch
from torch import nn

from .kda_mixer import KDAMixer


class DraftHeadBlock(nn.Module):
    def __init__(self, d_model: int = 8, ring: int = 4) -> None:
        super().__init__()
        self.mixer = KDAMixer(d_model, ring=ring, layer_idx=0)
        self.register_buffer("decay_cache", torch.zeros(1, self.mixer.nheads, ring, self.mixer.headdim, dtype=torch.float32))
        self.register_buffer("draft_len", torch.zeros((), dtype=torch.int64))


class DraftHeadBlockFp32Ring(DraftHeadBlock):
    def half(self) -> "DraftHeadBlockFp32Ring":
        super().half()
        self.decay_cache = self.decay_cache.to(torch.float32)
        return self


def fp16_draft_head(fp32_ring: bool) -> DraftHeadBlock:
    if fp32_ring:
        return DraftHeadBlockFp32Ring().half()
    block = DraftHeadBlock()
    block.half()  # expect-bug: module-cast
    return block


def build_fp16_draft_head() -> dict[str, torch.Tensor]:
    return dict(fp16_draft_head(fp32_ring=False).named_buffers())


def build_fp16_draft_head_fp32_ring() -> dict[str, torch.Tensor]:
    return dict(fp16_draft_head(fp32_ring=True).named_buffers())


def build_draft_head_cpu() -> dict[str, torch.Tensor]:
    return dict(DraftHeadBlock().to(device="cpu").named_buffers())
