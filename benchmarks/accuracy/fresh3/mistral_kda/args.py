import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Dict, Optional

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_from_str(name: str) -> torch.dtype:
    return _DTYPES[name.removeprefix("torch.")]


@dataclass
class LoraArgs:
    rank: int
    scaling: float

    def __post_init__(self) -> None:
        assert self.rank > 0
        assert self.scaling > 0.0


@dataclass
class KDAArgs:
    """Kimi Delta Attention layers (``"kda"`` in params.json)."""

    n_heads: int
    n_v_heads: int
    head_dim: int
    ring_len: int = 64
    full_attn_every: int = 4
    use_qk_l2norm: bool = True
    lower_bound: Optional[float] = None


@dataclass
class TransformerArgs:
    dim: int
    n_layers: int
    head_dim: int
    hidden_dim: int
    n_heads: int
    n_kv_heads: int
    norm_eps: float
    vocab_size: int
    max_batch_size: int = 0
    rope_theta: Optional[float] = None
    # If this is set, we will use sliding window attention
    sliding_window: Optional[int] = None
    kda: Optional[KDAArgs] = None
    # If this is set, the model is loaded with LoRA layers (fine-tuning checkpoints)
    lora: Optional[LoraArgs] = None
    model_type: str = "transformer"

    def __post_init__(self) -> None:
        assert self.model_type == "transformer", self.model_type
        assert self.kda is not None, "hybrid checkpoints only"

    def is_kda(self, layer_id: int) -> bool:
        return (layer_id + 1) % self.kda.full_attn_every != 0

    @classmethod
    def from_dict(cls, params: Dict[str, Any]) -> "TransformerArgs":
        known = {f.name for f in fields(cls)}
        params = {k: v for k, v in params.items() if k in known}
        kda, lora = params.pop("kda", None), params.pop("lora", None)
        return cls(**params, kda=KDAArgs(**kda) if kda else None, lora=LoraArgs(**lora) if lora else None)

    @classmethod
    def load(cls, folder: Path) -> "TransformerArgs":
        with open(Path(folder) / "params.json", "r") as f:
            return cls.from_dict(json.load(f))


# Host copies of the KDA cache (swap.SwapSpace): the recurrent checkpoint stays fp32, the rings
# follow the model dtype to halve the host memory a swapped-out sequence needs.
_HOST_FP32 = ("state",)  # expect-bug: imported-policy id=host-dtype


def host_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """dtype of a KDA cache tensor while swapped out to host memory."""
    if name == "write_pos":
        return torch.int32
    if name in _HOST_FP32:
        return torch.float32
    return model_dtype  # expect-bug: imported-policy id=host-dtype
