from typing import Any, NamedTuple

import torch
from torch import nn


class KDADecodeConfig(NamedTuple):
    """Decode-time settings of a KDA layer, fixed by the model builder.

    Args:
        ring_len (int): steps kept in the ReplaySSM rings before the state is flushed.
        gate_dtype (torch.dtype): dtype of the log-decay ring.
        use_qk_l2norm (bool): whether the op normalises q and k.
        lower_bound (Optional[float]): lower bound of the log-decays (sigmoid gate), if any.
    """

    ring_len: int = 4
    gate_dtype: torch.dtype = torch.bfloat16  # expect-bug: container id=tune-decode-cfg
    use_qk_l2norm: bool = True
    lower_bound: float | None = None


class ReplayCache(nn.Module):
    """
    Standalone ``nn.Module`` containing the ReplaySSM decode state of one KDA layer.

    Args:
        batch_size (int): batch size model will be run with
        num_heads, num_k_heads (int): value heads (HV) and query/key heads (H)
        ring_len (int): steps kept in the rings before the state is flushed
        head_k_dim, head_v_dim (int): per-head key and value dimensions (K, V)
        dtype (torch.dtype): dtype of the delta and key rings
        gate_dtype (torch.dtype): dtype of the log-decay ring. Default: torch.float32
    """

    def __init__(
        self,
        batch_size: int,
        num_heads: int,
        num_k_heads: int,
        ring_len: int,
        head_k_dim: int,
        head_v_dim: int,
        dtype: torch.dtype,
        gate_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        state_shape = (batch_size, num_heads, head_v_dim, head_k_dim)
        self.register_buffer(
            "state", torch.zeros(state_shape, dtype=torch.float32), persistent=False
        )
        d_shape = (batch_size, num_heads, ring_len, head_v_dim)
        self.register_buffer("d_cache", torch.zeros(d_shape, dtype=dtype), persistent=False)
        k_shape = (batch_size, num_k_heads, ring_len, head_k_dim)
        self.register_buffer("k_cache", torch.zeros(k_shape, dtype=dtype), persistent=False)
        g_shape = (batch_size, num_heads, ring_len, head_k_dim)
        self.register_buffer("g_cache", torch.zeros(g_shape, dtype=gate_dtype), persistent=False)
        self.register_buffer(
            "write_pos", torch.zeros(batch_size, dtype=torch.int32), persistent=False
        )
        self.batch_size = batch_size
        self.ring_len = ring_len

    @classmethod
    def from_config(
        cls,
        decode_cfg: KDADecodeConfig,
        batch_size: int,
        num_heads: int,
        num_k_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        gate_dtype: torch.dtype | None = None,
    ) -> "ReplayCache":
        if gate_dtype is None:
            gate_dtype = decode_cfg.gate_dtype  # expect-bug: container id=tune-decode-cfg
        return cls(
            batch_size,
            num_heads,
            num_k_heads,
            decode_cfg.ring_len,
            head_dim,
            head_dim,
            dtype,
            gate_dtype=gate_dtype,
        )

    def _apply(self, fn: Any, recurse: bool = True) -> "ReplayCache":
        # The checkpoint state and the log-decay ring keep their dtypes when the model is cast.
        kept = {name: self._buffers[name].dtype for name in ("state", "g_cache")}
        super()._apply(fn, recurse)
        for name, dtype in kept.items():
            self._buffers[name] = self._buffers[name].to(dtype)
        return self

    def reset(self) -> None:
        """Reset the cache to zero."""
        for buffer in (self.state, self.d_cache, self.k_cache, self.g_cache, self.write_pos):
            buffer.zero_()

    def expand(self, batch_size: int) -> None:
        """Re-allocates the cache for ``batch_size`` rows (several samples per prompt)."""
        self.state = self.state.new_zeros(batch_size, *self.state.shape[1:])
        self.d_cache = self.d_cache.new_zeros(batch_size, *self.d_cache.shape[1:])
        self.k_cache = self.k_cache.new_zeros(batch_size, *self.k_cache.shape[1:])
        self.g_cache = torch.zeros_like(self.d_cache)  # expect-bug: like
        self.write_pos = self.write_pos.new_zeros(batch_size)
        self.batch_size = batch_size


def _cache(dtype: torch.dtype = torch.bfloat16) -> ReplayCache:
    cache = ReplayCache(2, 2, 1, 4, 4, 4, dtype=dtype)
    cache.g_cache.copy_(-torch.rand(cache.g_cache.shape))
    cache.d_cache.copy_(torch.randn(cache.d_cache.shape))
    cache.write_pos.fill_(2)
    return cache


def build_expanded_cache() -> ReplayCache:
    cache = _cache()
    cache.expand(4)
    return cache


def build_cache_cast_with_model() -> nn.Module:
    model = nn.ModuleDict({"proj": nn.Linear(4, 4), "kv_cache": _cache(torch.float32)})
    return model.to(torch.bfloat16)
