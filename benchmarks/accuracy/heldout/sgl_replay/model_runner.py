"""ModelRunner-style loading: layers are constructed with the model dtype as the default."""

import torch
from torch import nn


class KimiDeltaAttention(nn.Module):
    def __init__(self, layer_id: int, num_v_heads: int = 2, head_dim: int = 4, ring: int = 4) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.A_log = nn.Parameter(torch.zeros(num_v_heads, dtype=torch.float32))
        # Padding rows of a captured batch read and write this dummy slot.
        self.dummy_d_ring = torch.empty(1, num_v_heads, ring, head_dim).fill_(0)
        self.dummy_gate_ring = torch.empty(1, num_v_heads, ring, head_dim).fill_(0)  # expect-bug: default-dtype


class KimiDeltaAttentionFp32Dummy(KimiDeltaAttention):
    def __init__(self, layer_id: int, num_v_heads: int = 2, head_dim: int = 4, ring: int = 4) -> None:
        super().__init__(layer_id, num_v_heads, head_dim, ring)
        self.dummy_gate_ring = torch.empty(1, num_v_heads, ring, head_dim, dtype=torch.float32).fill_(0)


class ModelRunner:
    def __init__(self, dtype: torch.dtype, fp32_dummy: bool = False) -> None:
        self.dtype = dtype
        self.fp32_dummy = fp32_dummy

    def load_model(self) -> nn.ModuleList:
        layer_class = KimiDeltaAttentionFp32Dummy if self.fp32_dummy else KimiDeltaAttention
        default = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            return nn.ModuleList([layer_class(i) for i in range(2)])
        finally:
            torch.set_default_dtype(default)


def _dummies(layers: nn.ModuleList) -> dict[str, torch.Tensor]:
    return {f"{i}.{n}": getattr(layer, n) for i, layer in enumerate(layers) for n in ("dummy_d_ring", "dummy_gate_ring")}


def build_runner_layers() -> dict[str, torch.Tensor]:
    return _dummies(ModelRunner(torch.bfloat16).load_model())


def build_runner_layers_fp32_dummy() -> dict[str, torch.Tensor]:
    return _dummies(ModelRunner(torch.bfloat16, fp32_dummy=True).load_model())
