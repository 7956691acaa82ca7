"""MTP / draft-target speculative decoding: gate prefixes for the accepted draft tokens."""

import torch

from .kv_cache_config import KvCacheConfig
from .mamba_cache_manager import create_mamba_cache_manager_fp32_gates


def accepted_gate_prefix(replay_g_cache: torch.Tensor, draft_log_decay: torch.Tensor, num_accepted: int) -> torch.Tensor:
    """Ring rows for the accepted draft tokens, each the running sum of their log-decays."""
    steps = draft_log_decay[:, :, :num_accepted]
    accepted_g_cache = steps.cumsum(dim=2) + replay_g_cache[:, :, :1]
    return accepted_g_cache


def accepted_gate_prefix_scaled(draft_log_decay: torch.Tensor, num_accepted: int, temperature: float) -> torch.Tensor:
    steps = draft_log_decay[:, :, :num_accepted]
    accepted_g_cache = steps.cumsum(dim=2) / temperature  # expect-bug: promotion
    return accepted_g_cache


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    manager = create_mamba_cache_manager_fp32_gates(KvCacheConfig(), torch.bfloat16)
    manager.reset()
    torch.manual_seed(0)
    draft = (-torch.rand(3, 2, 3, 4)).to(torch.bfloat16)
    return manager.replay_g_cache[0], draft


def build_accepted_prefix() -> dict[str, torch.Tensor]:
    ring, draft = _inputs()
    return {"accepted_g_cache": accepted_gate_prefix(ring, draft, 2)}


def build_accepted_prefix_scaled() -> dict[str, torch.Tensor]:
    _, draft = _inputs()
    return {"accepted_g_cache": accepted_gate_prefix_scaled(draft, 2, 1.0)}
