"""Model initialisation under the model dtype, and speculative-decoding gate prefixes."""

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from .config import ModelConfig
from .kda import KimiDeltaAttention


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


class KimiLinearModel(nn.Module):
    def __init__(self, model_config: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([KimiDeltaAttention(model_config, i) for i in range(model_config.num_kda_layers)])
        hv, dim = model_config.linear_num_value_heads, model_config.linear_head_dim
        # Decode rows padded for CUDA graphs point at this null slot.
        self.null_d_ring = torch.zeros(1, hv, 4, dim)
        self.null_log_decay_ring = torch.zeros((1, hv, 4, dim))  # expect-bug: default-dtype


class KimiLinearModelFp32Null(KimiLinearModel):
    def __init__(self, model_config: ModelConfig) -> None:
        super().__init__(model_config)
        self.null_log_decay_ring = self.null_log_decay_ring.to(torch.float32)


def get_model(model_config: ModelConfig, fp32_null_ring: bool) -> KimiLinearModel:
    with set_default_torch_dtype(model_config.dtype):
        cls = KimiLinearModelFp32Null if fp32_null_ring else KimiLinearModel
        return cls(model_config)


def draft_log_decay_prefix(log_decay_ring: torch.Tensor, draft_g: torch.Tensor, slot: int) -> torch.Tensor:
    """Prefix sums of the draft tokens' log-decays, continuing the slot's accumulated sum."""
    carried = log_decay_ring[slot].sum(dim=1, keepdim=True)
    return carried + torch.cumsum(draft_g, dim=1)


def draft_log_decay_prefix_python_carry(log_decay_ring: torch.Tensor, draft_g: torch.Tensor, slot: int) -> torch.Tensor:
    carried = log_decay_ring[slot].sum().item()
    draft_log_decay_ring = torch.cumsum(draft_g, dim=1) * 1.0 + carried  # expect-bug: promotion
    return draft_log_decay_ring


def _draft() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return -torch.rand(3, 2, 4, 4), (-torch.rand(2, 3, 4)).bfloat16()


def build_model_default() -> dict[str, torch.Tensor]:
    model = get_model(ModelConfig(), fp32_null_ring=False)
    return {"null_d_ring": model.null_d_ring, "null_log_decay_ring": model.null_log_decay_ring}


def build_model_fp32_null() -> dict[str, torch.Tensor]:
    model = get_model(ModelConfig(), fp32_null_ring=True)
    return {"null_d_ring": model.null_d_ring, "null_log_decay_ring": model.null_log_decay_ring}


def build_draft_prefix() -> dict[str, torch.Tensor]:
    return {"draft_log_decay_ring": draft_log_decay_prefix(*_draft(), slot=0)}


def build_draft_prefix_python_carry() -> dict[str, torch.Tensor]:
    return {"draft_log_decay_ring": draft_log_decay_prefix_python_carry(*_draft(), slot=0)}
