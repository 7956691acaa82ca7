"""Checks and dumps used by the engine's debug mode (VLLM_DEBUG_KDA_STATE)."""

import io

import torch
from torch import nn

from .cache import HEAD_K, RING, VALUE_HEADS
from .utils import make_gate_ring_fp32

GATE_RING_DTYPE = torch.float32


def check_gate_ring(g_ring: torch.Tensor) -> None:
    if g_ring.dtype != torch.float32:
        raise TypeError(f"g_ring must be float32, got {g_ring.dtype}")


def dump_gate_ring(g_ring: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    torch.save({"g_ring": g_ring.detach().clone()}, buffer)
    return buffer.getvalue()


def load_gate_ring_dump(raw: bytes) -> torch.Tensor:
    g_ring = torch.load(io.BytesIO(raw), weights_only=True)["g_ring"].to(GATE_RING_DTYPE)
    return g_ring


class RingHolder(nn.Module):
    """Keeps a ring as a plain attribute: Module.to() converts parameters and buffers only."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.g_ring = torch.zeros(1, VALUE_HEADS, RING, HEAD_K, dtype=torch.float32)


def build_debug_roundtrip() -> dict[str, torch.Tensor]:
    g_ring = make_gate_ring_fp32(2)
    check_gate_ring(g_ring)
    restored = load_gate_ring_dump(dump_gate_ring(g_ring.normal_()))
    scratch_g_ring = torch.zeros_like(restored)
    return {"g_ring": restored, "scratch_g_ring": scratch_g_ring, "twin_g_ring": restored.new_zeros(2, 3)}


def build_holder_to_bf16() -> dict[str, torch.Tensor]:
    holder = RingHolder().to(torch.bfloat16)
    return {"g_ring": holder.g_ring, "weight": holder.proj.weight}
