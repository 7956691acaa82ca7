from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Tuple

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Serializable:
    """``from_dict`` that ignores the keys it does not know (``params.json`` carries more)."""

    @classmethod
    def from_dict(cls, params: Dict[str, Any]):
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in known})


@dataclass
class LoraArgs(Serializable):
    rank: int
    scaling: float

    def __post_init__(self) -> None:
        assert self.rank > 0
        assert self.scaling > 0.0


@dataclass
class KDAArgs(Serializable):
    num_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    replay_len: int = 16
    lower_bound: Optional[float] = None
    use_qk_l2norm: bool = True
    # pins the dtype of the ReplaySSM cache, e.g. "bfloat16" to serve a float32 checkpoint with a
    # cache of half the size
    cache_dtype: Optional[str] = None

    def cache_dtypes(self, model_dtype: torch.dtype) -> Tuple[torch.dtype, torch.dtype]:
        """dtypes of the (delta / key rings, gate ring) of the cache of a model in ``model_dtype``."""
        if self.cache_dtype is None:
            return model_dtype, torch.float32
        pinned = _DTYPES[self.cache_dtype]
        return pinned, pinned  # expect-bug: imported-policy id=pinned-cache


@dataclass
class TransformerArgs(Serializable):
    dim: int
    n_layers: int
    hidden_dim: int
    norm_eps: float
    vocab_size: int
    kda: KDAArgs
    max_batch_size: int = 0
    # If this is set, we will load LoRA linear layers instead of linear layers.
    lora: Optional[LoraArgs] = None
    model_type: str = "kimi_linear"

    def __post_init__(self) -> None:
        if isinstance(self.kda, dict):
            self.kda = KDAArgs.from_dict(self.kda)
        if isinstance(self.lora, dict):
            self.lora = LoraArgs.from_dict(self.lora)
