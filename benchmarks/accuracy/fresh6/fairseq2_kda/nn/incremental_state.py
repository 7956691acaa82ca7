"""Incremental decode state of KDA layers, kept per module in a state bag."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TypeVar

import torch
from torch import Tensor, nn

from ..config import DataType, Device, KDAConfig


class IncrementalState(ABC):
    @abstractmethod
    def reorder(self, new_order: Tensor) -> None: ...


T = TypeVar("T", bound=IncrementalState)


class IncrementalStateBag:
    def __init__(self, max_num_steps: int) -> None:
        self.step_nr = 0
        self.max_num_steps = max_num_steps
        self._module_states: dict[nn.Module, IncrementalState] = {}

    def increment_step_nr(self, value: int = 1) -> None:
        self.step_nr = min(self.step_nr + value, self.max_num_steps)

    def get_state(self, m: nn.Module, kls: type[T]) -> T | None:
        state = self._module_states.get(m)
        return state if isinstance(state, kls) else None

    def set_state(self, m: nn.Module, state: IncrementalState) -> None:
        self._module_states[m] = state

    def states(self) -> list[IncrementalState]:
        return list(self._module_states.values())


class ReplayRingState(IncrementalState):
    """Checkpoint state, delta/key rings (model dtype) and log-decay ring of one KDA layer."""

    FIELDS = ("checkpoint", "d_ring", "k_ring", "log_alpha_ring", "write_pos")

    def __init__(self, checkpoint: Tensor, d_ring: Tensor, k_ring: Tensor, log_alpha_ring: Tensor, write_pos: Tensor | None = None) -> None:
        self.checkpoint, self.d_ring, self.k_ring = checkpoint, d_ring, k_ring
        self.log_alpha_ring = log_alpha_ring
        self.write_pos = torch.zeros(checkpoint.size(0), dtype=torch.int64) if write_pos is None else write_pos
        self.slots = torch.arange(checkpoint.size(0), device=checkpoint.device)

    @classmethod
    def allocate(
        cls, config: KDAConfig, batch_size: int, *, device: Device | None = None,
        dtype: DataType | None = None, gate_dtype: DataType | None = None,
    ) -> ReplayRingState:
        dtype = dtype or config.replay_dtype
        hv, hk, d, n = config.num_v_heads, config.num_k_heads, config.head_dim, config.replay_len
        return cls(
            checkpoint=torch.zeros(batch_size, hv, d, d, device=device, dtype=torch.float32),
            d_ring=torch.zeros(batch_size, hv, n, d, device=device, dtype=dtype),
            k_ring=torch.zeros(batch_size, hk, n, d, device=device, dtype=dtype),
            log_alpha_ring=torch.zeros(batch_size, hv, n, d, device=device, dtype=gate_dtype or config.gate_dtype),
        )

    def reorder(self, new_order: Tensor) -> None:
        for name in self.FIELDS:
            setattr(self, name, getattr(self, name).index_select(0, new_order))

    def empty_like(self) -> ReplayRingState:
        """A zeroed state of the same layout, for a request that takes over these slots."""
        checkpoint, d_ring, k_ring = (torch.zeros_like(t) for t in (self.checkpoint, self.d_ring, self.k_ring))
        log_alpha_ring = torch.zeros_like(self.d_ring)  # expect-bug: like
        return ReplayRingState(checkpoint, d_ring, k_ring, log_alpha_ring)

    def to(self, device: Device | None = None, dtype: DataType | None = None) -> ReplayRingState:
        """Moves the state; ``dtype`` is the new dtype of the rings."""
        self.checkpoint = self.checkpoint.to(device=device)
        self.d_ring = self.d_ring.to(device=device, dtype=dtype)
        self.k_ring = self.k_ring.to(device=device, dtype=dtype)
        self.log_alpha_ring = self.log_alpha_ring.to(device=device, dtype=dtype)  # expect-bug: cast
        self.write_pos = self.write_pos.to(device=device)
        return self


class ReplayStatePool:
    """Rings of up to ``max_num_slots`` sequences for every layer, allocated once up front."""

    def __init__(self, config: KDAConfig, *, device: Device | None = None, dtype: DataType | None = None) -> None:
        self.dtype = dtype or config.dtype
        layers, slots = config.num_layers, config.max_num_slots
        hv, hk, d, n = config.num_v_heads, config.num_k_heads, config.head_dim, config.replay_len
        self.checkpoints = torch.zeros(layers, slots, hv, d, d, device=device, dtype=torch.float32)
        self.d_rings = torch.zeros(layers, slots, hv, n, d, device=device, dtype=self.dtype)
        self.k_rings = torch.zeros(layers, slots, hk, n, d, device=device, dtype=self.dtype)
        self.log_alpha_rings = torch.zeros(layers, slots, hv, n, d, device=device, dtype=self.dtype)  # expect-bug: pool-dtype
        self.write_pos = torch.zeros(slots, dtype=torch.int64, device=device)


def build_state_pool() -> ReplayStatePool:
    return ReplayStatePool(KDAConfig())


def build_request_handover() -> dict[str, object]:
    config = KDAConfig()
    previous = ReplayRingState.allocate(config, 2)
    previous.d_ring.normal_()
    return {"previous": previous, "next": previous.empty_like()}
