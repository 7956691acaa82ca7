"""DefaultModelLoader-style construction: the model is built under the model dtype."""

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    yield
    torch.set_default_dtype(old_dtype)


class KimiDeltaAttention(nn.Module):
    def __init__(self, layer_id: int, num_v_heads: int = 2, head_dim: int = 4, ring: int = 4) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.A_log = nn.Parameter(torch.empty(num_v_heads, dtype=torch.float32).uniform_(0, 1))
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads, head_dim))
        # Dummy state for the CUDA-graph padding rows (slot 0 of the pool is not a request).
        self.pad_replay_d = torch.zeros(1, num_v_heads, ring, head_dim)
        self.pad_replay_g = torch.zeros(1, num_v_heads, ring, head_dim)  # expect-bug: default-dtype


class KimiDeltaAttentionFp32Pad(KimiDeltaAttention):
    def __init__(self, layer_id: int, num_v_heads: int = 2, head_dim: int = 4, ring: int = 4) -> None:
        super().__init__(layer_id, num_v_heads, head_dim, ring)
        self.pad_replay_g = torch.zeros(1, num_v_heads, ring, head_dim, dtype=torch.float32)


def load_model(dtype: torch.dtype, fp32_pad: bool) -> nn.ModuleList:
    layer_class = KimiDeltaAttentionFp32Pad if fp32_pad else KimiDeltaAttention
    with set_default_torch_dtype(dtype):
        return nn.ModuleList([layer_class(i) for i in range(2)])


def _pads(layers: nn.ModuleList) -> dict[str, torch.Tensor]:
    return {f"{i}.{n}": getattr(layer, n) for i, layer in enumerate(layers) for n in ("pad_replay_d", "pad_replay_g")}


def build_loaded_layers() -> dict[str, torch.Tensor]:
    return _pads(load_model(torch.bfloat16, fp32_pad=False))


def build_loaded_layers_fp32_pad() -> dict[str, torch.Tensor]:
    return _pads(load_model(torch.bfloat16, fp32_pad=True))
