"""Kimi-Linear style transformer whose layers are Kimi Delta Attention (KDA), decoding with the
ReplaySSM cache. (The MLA layers of the released checkpoints are not part of this port.) The caches
are buffers of the model, so that ``torch.compile(mode="reduce-overhead")`` captures them.
"""
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn import functional as F

from .kernels import replay_kda_decode
from .quantize import replay_cache_dtypes


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


@dataclass
class ModelArgs:
    block_size: int = 2048
    vocab_size: int = 32000
    n_layer: int = 32
    dim: int = 4096
    intermediate_size: int = None
    norm_eps: float = 1e-5
    # Kimi Delta Attention
    kda_heads: int = 32
    kda_v_heads: int = 32
    kda_head_dim: int = 128
    kda_v_dim: int = 128
    replay_len: int = 16
    kda_lower_bound: Optional[float] = None
    # > 0: _load_model allocates the ReplaySSM pool once, with this many slots (CUDA graphs)
    static_state_slots: int = 0

    def __post_init__(self):
        if self.intermediate_size is None:
            self.intermediate_size = find_multiple(int(8 * self.dim / 3), 256)

    @classmethod
    def from_name(cls, name: str):
        if name in transformer_configs:
            return cls(**transformer_configs[name])
        # fuzzy search: the longest config name contained in ``name``
        config = [config for config in transformer_configs if config.lower() in str(name).lower()]
        assert len(config) >= 1, name
        return cls(**transformer_configs[max(config, key=len)])


_TINY = dict(block_size=64, n_layer=2, dim=32, intermediate_size=64, vocab_size=128, kda_heads=2, kda_v_heads=2,
             kda_head_dim=8, kda_v_dim=8, replay_len=4)

transformer_configs = {
    "Kimi-Linear-48B-A3B": dict(block_size=131072, n_layer=27, dim=2304, intermediate_size=9216, vocab_size=163840),
    "kda-tiny": _TINY,
    "kda-tiny-lb": dict(_TINY, kda_lower_bound=-5.0),
    "kda-tiny-static": dict(_TINY, static_state_slots=2),
}


class ReplayCache(nn.Module):
    """ReplaySSM cache of one KDA layer.

    ``state`` is the float32 checkpoint ``[B, HV, V, K]``. ``d_cache`` and ``k_cache`` hold the
    deltas and keys of the last ``replay_len`` steps in the model dtype; ``g_cache`` holds their
    log-decays, which the kernel prefix-sums and exponentiates. ``write_pos`` is each slot's
    position in the rings.
    """

    def __init__(self, max_batch_size, n_heads, n_v_heads, head_dim, v_dim, replay_len,
                 dtype=torch.bfloat16, gate_dtype=torch.float32):
        super().__init__()
        self.replay_len = replay_len
        self.register_buffer("state", torch.zeros(max_batch_size, n_v_heads, v_dim, head_dim, dtype=torch.float32))
        self.register_buffer("d_cache", torch.zeros(max_batch_size, n_v_heads, replay_len, v_dim, dtype=dtype))
        self.register_buffer("k_cache", torch.zeros(max_batch_size, n_heads, replay_len, head_dim, dtype=dtype))
        self.register_buffer("g_cache", torch.zeros(max_batch_size, n_v_heads, replay_len, head_dim, dtype=gate_dtype))
        self.register_buffer("write_pos", torch.zeros(max_batch_size, dtype=torch.int32))
        self.register_buffer("slot_indices", torch.arange(max_batch_size, dtype=torch.int32))


class Transformer(nn.Module):
    def __init__(self, config: ModelArgs) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, eps=config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.max_batch_size = -1
        self.max_seq_length = -1

    def setup_caches(self, max_batch_size: int, max_seq_length: int) -> None:
        if self.max_seq_length >= max_seq_length and self.max_batch_size >= max_batch_size:
            return
        max_seq_length = find_multiple(max_seq_length, 8)
        self.max_seq_length = max_seq_length
        self.max_batch_size = max_batch_size
        dtype = self.output.weight.dtype
        quant_mode = None
        # for quantized layers the compute dtype is the one of the scales
        if hasattr(self.output, "scales"):
            dtype, quant_mode = self.output.scales.dtype, "int8"
        ring_dtype, gate_dtype = replay_cache_dtypes(quant_mode, dtype)  # expect-bug: imported-policy id=int8-rings
        for b in self.layers:
            kda = b.attention
            kda.kv_cache = ReplayCache(max_batch_size, kda.n_heads, kda.n_v_heads, kda.head_dim, kda.v_dim,
                                       self.config.replay_len, ring_dtype, gate_dtype)

    def replay_caches(self) -> List[ReplayCache]:
        return [b.attention.kv_cache for b in self.layers]

    def forward(self, idx: Tensor, input_pos: Optional[Tensor] = None) -> Tensor:
        # input_pos is unused: the ReplaySSM state carries the position
        assert self.max_batch_size > 0, "Caches must be initialized first"
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))

    @classmethod
    def from_name(cls, name: str):
        return cls(ModelArgs.from_name(name))


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelArgs) -> None:
        super().__init__()
        self.attention = KimiDeltaAttention(config)
        self.feed_forward = FeedForward(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class KimiDeltaAttention(nn.Module):
    def __init__(self, config: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_v_heads = config.kda_heads, config.kda_v_heads
        self.head_dim, self.v_dim = config.kda_head_dim, config.kda_v_dim
        self.lower_bound = config.kda_lower_bound
        self.qkv_sizes = [self.n_heads * self.head_dim] * 2 + [self.n_v_heads * self.v_dim]
        self.wqkv = nn.Linear(config.dim, sum(self.qkv_sizes), bias=False)
        self.wa = nn.Linear(config.dim, self.n_v_heads * self.head_dim, bias=False)
        self.wb = nn.Linear(config.dim, self.n_v_heads, bias=False)
        self.wo = nn.Linear(self.n_v_heads * self.v_dim, config.dim, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, self.n_v_heads + 1, dtype=torch.float32)))
        self.dt_bias = nn.Parameter(torch.zeros(self.n_v_heads * self.head_dim))
        self.kv_cache: Optional[ReplayCache] = None

    def forward(self, x: Tensor) -> Tensor:
        bsz, seqlen, _ = x.shape
        mixed_qkv, a, b = self.wqkv(x), self.wa(x), self.wb(x)
        if seqlen > 1:
            return self.wo(self._prefill(mixed_qkv, a))
        cache = self.kv_cache
        out = x.new_zeros(bsz, self.n_v_heads, self.v_dim)
        y, _ = replay_kda_decode(
            mixed_qkv[:, 0], a[:, 0], b[:, 0], self.A_log, self.dt_bias, self.head_dim ** -0.5,
            cache.state, cache.d_cache, cache.k_cache, cache.g_cache, out,
            cache.slot_indices[:bsz], cache.write_pos[:bsz],
            use_qk_l2norm_in_kernel=True, lower_bound=self.lower_bound,
        )
        return self.wo(y.view(bsz, 1, -1))

    def _log_decay(self, a: Tensor) -> Tensor:
        """Per-step log-decay of the gate, [B, S, HV, K]."""
        a = a.unflatten(-1, (self.n_v_heads, self.head_dim))
        dt_bias = self.dt_bias.view(self.n_v_heads, self.head_dim)
        if self.lower_bound is not None:
            # bounded gate, in (lower_bound, 0)
            return self.lower_bound * torch.sigmoid(self.A_log.exp()[:, None] * (a + dt_bias))  # expect-bug: promotion id=bounded-gate
        return -self.A_log.float().exp()[:, None] * F.softplus(a.float() + dt_bias.float())

    def _prefill(self, mixed_qkv: Tensor, a: Tensor) -> Tensor:
        """Prompt processing. The chunked kernel (skipped on CPU, outputs are zero) leaves the state
        at the start of the last ``replay_len`` steps; the rings get those steps."""
        bsz, seqlen, _ = mixed_qkv.shape
        _, k, v = mixed_qkv.split(self.qkv_sizes, dim=-1)
        g = self._log_decay(a)
        cache = self.kv_cache
        n = min(seqlen, cache.replay_len)
        k_tail = k[:, -n:].unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)
        d_tail = v[:, -n:].unflatten(-1, (self.n_v_heads, self.v_dim)).transpose(1, 2)
        g_tail = g[:, -n:].transpose(1, 2)
        if n == cache.replay_len:
            cache.d_cache, cache.k_cache = d_tail.contiguous(), k_tail.contiguous()
            cache.g_cache = g_tail.contiguous()  # expect-bug: promotion id=bounded-gate
        else:
            # a short prompt: its steps fill the start of the rings, write_pos points after them
            cache.d_cache[:, :, :n] = d_tail
            cache.k_cache[:, :, :n] = k_tail
            cache.g_cache[:, :, :n] = g_tail
        cache.write_pos.fill_(n % cache.replay_len)
        return mixed_qkv.new_zeros(bsz, seqlen, self.n_v_heads * self.v_dim)


class FeedForward(nn.Module):
    def __init__(self, config: ModelArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.intermediate_size, bias=False)
        self.w3 = nn.Linear(config.dim, config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight
