"""The KDA layer of the PyTorch backend and the disaggregated-serving state transfer."""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from .dtypes import KvCacheConfig
from .resource_manager import ReplayStateManager, ReplayStateView, make_manager

LAUNCHED: dict[str, torch.Tensor] = {}


def kda_replayssm_decode(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    scale: float, initial_state: torch.Tensor, d_cache: torch.Tensor, k_cache: torch.Tensor,
    g_cache: torch.Tensor, out: torch.Tensor, ssm_state_indices: torch.Tensor, write_pos: torch.Tensor,
    force_flush: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    LAUNCHED.update(initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache)
    return out.zero_()


@dataclass
class KDAMetadata:
    request_ids: list[int]
    manager: ReplayStateManager


class KDALayer(nn.Module):
    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.A_log = nn.Parameter(torch.zeros(2, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.zeros(2, 4, dtype=torch.float32))

    def _run(self, view: ReplayStateView, slots: torch.Tensor, mixed_qkv: torch.Tensor) -> torch.Tensor:
        out = torch.empty(mixed_qkv.shape[0], 1, 2, 4, dtype=mixed_qkv.dtype)
        kda_replayssm_decode(
            mixed_qkv, mixed_qkv, mixed_qkv, self.A_log, self.dt_bias, 0.5, view.ssm, view.d, view.k, view.g,
            out, slots, torch.zeros_like(slots),
        )
        return out

    def forward(self, mixed_qkv: torch.Tensor, metadata: KDAMetadata) -> torch.Tensor:
        slots = metadata.manager.add_requests(metadata.request_ids)
        return self._run(metadata.manager.view(self.layer_idx), slots, mixed_qkv)

    def forward_draft(self, mixed_qkv: torch.Tensor, metadata: KDAMetadata) -> torch.Tensor:
        """Draft-model steps start from empty rings and the target's checkpoint state."""
        slots = metadata.manager.add_requests(metadata.request_ids)
        target = metadata.manager.view(self.layer_idx)
        draft = ReplayStateView(
            ssm=target.ssm.clone(),
            d=torch.zeros_like(target.d),
            k=torch.zeros_like(target.k),
            g=torch.zeros_like(target.d),  # expect-bug: decode-arg
        )
        return self._run(draft, slots, mixed_qkv)


def stage_replayssm_g(staged: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Generation server side: the transferred gate ring is staged into the local pool's layout."""
    replayssm_g = staged.contiguous().type(dtype)  # expect-bug: cast id=trr-stage
    return replayssm_g


def stage_replayssm_g_fp32(staged: torch.Tensor) -> torch.Tensor:
    replayssm_g = staged.contiguous().type(torch.float32)
    return replayssm_g


def read_replayssm_g_file(path: str, numel: int) -> torch.Tensor:
    """The context server spills rings to local NVMe as raw fp16 when under memory pressure."""
    replayssm_g = torch.from_file(path, shared=False, size=numel, dtype=torch.float16)  # expect-bug: load
    return replayssm_g


def _metadata() -> KDAMetadata:
    return KDAMetadata([4, 5], make_manager(KvCacheConfig(), "bfloat16", fp32_gate=True))


def build_layer_forward() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    KDALayer(1)(torch.randn(2, 16).bfloat16(), _metadata())
    return dict(LAUNCHED)


def build_layer_forward_draft() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    KDALayer(1).forward_draft(torch.randn(2, 16).bfloat16(), _metadata())
    return dict(LAUNCHED)


def _staged() -> torch.Tensor:
    return torch.linspace(-2.0, 0.0, 32).view(1, 2, 4, 4)


def build_stage_gate_ring() -> dict[str, torch.Tensor]:
    return {"replayssm_g": stage_replayssm_g(_staged(), torch.bfloat16)}  # expect-bug: cast id=trr-stage


def build_stage_gate_ring_fp32() -> dict[str, torch.Tensor]:
    return {"replayssm_g": stage_replayssm_g_fp32(_staged())}


def build_read_spilled_ring(tmp_dir: str) -> dict[str, torch.Tensor]:
    path = f"{tmp_dir}/ring.bin"
    torch.linspace(-1.0, 0.0, 32, dtype=torch.float16).numpy().tofile(path)
    return {"replayssm_g": read_replayssm_g_file(path, 32)}
