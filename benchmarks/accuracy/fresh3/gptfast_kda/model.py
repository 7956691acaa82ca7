# Hybrid Kimi Delta Attention / GQA transformer, in the layout of gpt-fast's model.py.
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn import functional as F

from .kernels import kda_replayssm_decode


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


@dataclass
class ModelArgs:
    block_size: int = 2048
    vocab_size: int = 32000
    n_layer: int = 32
    n_head: int = 32
    dim: int = 4096
    intermediate_size: int = None
    n_local_heads: int = -1
    head_dim: int = 64
    rope_base: float = 10000
    norm_eps: float = 1e-5
    # every full_attn_every-th block is GQA attention, the others are KDA
    full_attn_every: int = 4
    kda_n_head: int = 16
    kda_n_v_head: int = 16
    kda_head_dim: int = 128
    kda_ring_len: int = 64
    kda_gate_fn: str = "softplus"  # "logsigmoid": the GLA gate of the distilled checkpoints
    kda_gate_logit_normalizer: float = 16.0
    kda_lower_bound: Optional[float] = None

    def __post_init__(self):
        if self.n_local_heads == -1:
            self.n_local_heads = self.n_head
        if self.intermediate_size is None:
            self.intermediate_size = find_multiple(int(2 * 4 * self.dim / 3), 256)
        self.head_dim = self.dim // self.n_head

    def is_kda(self, layer_id: int) -> bool:
        return (layer_id + 1) % self.full_attn_every != 0

    @classmethod
    def from_name(cls, name: str):
        if name in transformer_configs:
            return cls(**transformer_configs[name])
        # fuzzy search
        config = [config for config in transformer_configs if config.lower() in str(name).lower()]
        assert len(config) >= 1, name
        config.sort(key=len, reverse=True)  # "kda-tiny-gla" before "kda-tiny"
        return cls(**transformer_configs[config[0]])


transformer_configs = {
    "Kimi-Linear-48B-A3B": dict(block_size=131072, n_layer=27, n_head=32, dim=2304, intermediate_size=9216,
                                vocab_size=163840, rope_base=50000, kda_n_head=32, kda_n_v_head=32),
    "kda-tiny": dict(block_size=64, n_layer=4, n_head=4, n_local_heads=2, dim=32, intermediate_size=64,
                     vocab_size=96, full_attn_every=2, kda_n_head=2, kda_n_v_head=2, kda_head_dim=8, kda_ring_len=4),
}
transformer_configs["kda-tiny-gla"] = dict(transformer_configs["kda-tiny"], kda_gate_fn="logsigmoid")


class KVCache(nn.Module):
    def __init__(self, max_batch_size, max_seq_length, n_heads, head_dim, dtype=torch.bfloat16):
        super().__init__()
        cache_shape = (max_batch_size, n_heads, max_seq_length, head_dim)
        self.register_buffer("k_cache", torch.zeros(cache_shape, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(cache_shape, dtype=dtype))

    def update(self, input_pos, k_val, v_val):
        # input_pos: [S], k_val: [B, H, S, D]
        assert input_pos.shape[0] == k_val.shape[2]
        self.k_cache[:, :, input_pos] = k_val
        self.v_cache[:, :, input_pos] = v_val
        return self.k_cache, self.v_cache


class KDACache(nn.Module):
    """ReplaySSM state of one KDA layer: the float32 checkpoint ``state [B, HV, V, K]`` and rings
    of the steps since it (deltas ``d_cache``, keys ``k_cache``, log-decays ``g_cache``), which the
    kernel replays and folds in when ``write_pos`` reaches ``ring_len``. d/k follow the
    activations; the log-decays are prefix-summed and exponentiated in the kernel and use
    ``gate_dtype`` (``None``: torch's default dtype, float32)."""

    def __init__(self, max_batch_size, n_heads, n_v_heads, head_dim, ring_len, dtype=torch.bfloat16, gate_dtype=None):
        super().__init__()
        self.ring_len = ring_len
        self.register_buffer("d_cache", torch.zeros(max_batch_size, n_v_heads, ring_len, head_dim, dtype=dtype))
        self.register_buffer("k_cache", torch.zeros(max_batch_size, n_heads, ring_len, head_dim, dtype=dtype))
        self.register_buffer("g_cache", torch.zeros(max_batch_size, n_v_heads, ring_len, head_dim, dtype=gate_dtype))  # expect-bug: default-dtype id=eval-default
        self.register_buffer("state", torch.zeros(max_batch_size, n_v_heads, head_dim, head_dim, dtype=torch.float32))
        self.register_buffer("write_pos", torch.zeros(max_batch_size, dtype=torch.int32))

    def rings(self):
        """(d, k, g, write_pos) the next decode step reads and appends to."""
        return self.d_cache, self.k_cache, self.g_cache, self.write_pos

    def resize(self, max_batch_size: int) -> None:
        """More slots, keeping the ones in use."""
        n = max_batch_size - self.d_cache.shape[0]
        if n <= 0:
            return
        d_pad = self.d_cache.new_zeros((n, *self.d_cache.shape[1:]))
        self.d_cache = torch.cat([self.d_cache, d_pad])
        self.k_cache = torch.cat([self.k_cache, self.k_cache.new_zeros((n, *self.k_cache.shape[1:]))])
        # K == V, so the zero rows of d fit the log-decay ring; cat promotes them to its dtype
        self.g_cache = torch.cat([self.g_cache, torch.zeros_like(d_pad)])
        self.state = torch.cat([self.state, self.state.new_zeros((n, *self.state.shape[1:]))])
        self.write_pos = torch.cat([self.write_pos, self.write_pos.new_zeros(n)])


class SpecKDACache(KDACache):
    """KDACache of the target model in speculative decoding: while verifying, decode steps go to
    side rings, and ``commit(n)`` appends the accepted ones to the main rings."""

    # side ring -> dtype (None: the cache dtype)
    side_rings: Dict[str, Optional[torch.dtype]] = {"d_side": None, "k_side": None, "g_side": None}  # expect-bug: container

    def __init__(self, max_batch_size, n_heads, n_v_heads, head_dim, ring_len, dtype=torch.bfloat16, gate_dtype=None, speculate_k=4):
        super().__init__(max_batch_size, n_heads, n_v_heads, head_dim, ring_len, dtype, gate_dtype)
        heads = {"d_side": n_v_heads, "k_side": n_heads, "g_side": n_v_heads}
        for name, side_dtype in self.side_rings.items():
            self.register_buffer(name, torch.zeros(max_batch_size, heads[name], speculate_k + 1, head_dim, dtype=side_dtype or dtype))
        self.register_buffer("side_pos", torch.zeros(max_batch_size, dtype=torch.int32))
        self.verifying = False

    def rings(self):
        return (self.d_side, self.k_side, self.g_side, self.side_pos) if self.verifying else super().rings()

    def begin_verify(self):
        self.verifying = True
        self.side_pos.zero_()

    def commit(self, n: int) -> None:
        """Appends the first ``n`` verified steps to the main rings."""
        self.verifying = False
        for slot in range(self.write_pos.shape[0]):
            p = int(self.write_pos[slot])
            m = min(n, self.ring_len - p)  # a full ring is flushed by the next decode step
            self.d_cache[slot, :, p : p + m] = self.d_side[slot, :, :m]
            self.k_cache[slot, :, p : p + m] = self.k_side[slot, :, :m]
            self.g_cache[slot, :, p : p + m] = self.g_side[slot, :, :m]
            self.write_pos[slot] += m


class Transformer(nn.Module):
    def __init__(self, config: ModelArgs) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config, i) for i in range(config.n_layer))
        self.norm = RMSNorm(config.dim, eps=config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.freqs_cis: Optional[Tensor] = None
        self.max_batch_size = -1
        self.max_seq_length = -1

    def setup_caches(self, max_batch_size, max_seq_length, gate_dtype=None, cache_cls=None):
        if self.max_seq_length >= max_seq_length and self.max_batch_size >= max_batch_size:
            return
        c = self.config
        head_dim = c.dim // c.n_head
        max_seq_length = find_multiple(max_seq_length, 8)
        self.max_seq_length, self.max_batch_size = max_seq_length, max_batch_size
        dtype = self.output.weight.dtype
        # For quantized layers, dtype is encoded in scales
        if hasattr(self.output, "scales"):
            dtype = self.output.scales.dtype
        elif hasattr(self.output, "scales_and_zeros"):
            dtype = self.output.scales_and_zeros.dtype
        cache_cls = cache_cls or KDACache
        for b in self.layers:
            if b.is_kda:
                b.attention.kda_cache = cache_cls(max_batch_size, c.kda_n_head, c.kda_n_v_head, c.kda_head_dim, c.kda_ring_len, dtype, gate_dtype)
            else:
                b.attention.kv_cache = KVCache(max_batch_size, max_seq_length, c.n_local_heads, head_dim, dtype)
        self.freqs_cis = precompute_freqs_cis(c.block_size, head_dim, c.rope_base, dtype)
        self.causal_mask = torch.tril(torch.ones(self.max_seq_length, self.max_seq_length, dtype=torch.bool))

    def forward(self, idx: Tensor, input_pos: Optional[Tensor] = None) -> Tensor:
        assert self.freqs_cis is not None, "Caches must be initialized first"
        mask = self.causal_mask[None, None, input_pos]
        freqs_cis = self.freqs_cis[input_pos]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, input_pos, freqs_cis, mask)
        return self.output(self.norm(x))

    @classmethod
    def from_name(cls, name: str):
        return cls(ModelArgs.from_name(name))


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.is_kda = config.is_kda(layer_id)
        self.attention = KDAAttention(config) if self.is_kda else Attention(config)
        self.feed_forward = FeedForward(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x: Tensor, input_pos: Tensor, freqs_cis: Tensor, mask: Tensor) -> Tensor:
        if self.is_kda:
            h = x + self.attention(self.attention_norm(x), input_pos)
        else:
            h = x + self.attention(self.attention_norm(x), freqs_cis, mask, input_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class Attention(nn.Module):
    def __init__(self, config: ModelArgs):
        super().__init__()
        assert config.dim % config.n_head == 0
        total_head_dim = (config.n_head + 2 * config.n_local_heads) * config.head_dim
        self.wqkv = nn.Linear(config.dim, total_head_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        self.kv_cache = None
        self.n_head, self.head_dim, self.n_local_heads, self.dim = config.n_head, config.head_dim, config.n_local_heads, config.dim

    def forward(self, x: Tensor, freqs_cis: Tensor, mask: Tensor, input_pos: Optional[Tensor] = None) -> Tensor:
        bsz, seqlen, _ = x.shape
        kv_size = self.n_local_heads * self.head_dim
        q, k, v = self.wqkv(x).split([self.dim, kv_size, kv_size], dim=-1)
        q = apply_rotary_emb(q.view(bsz, seqlen, self.n_head, self.head_dim), freqs_cis)
        k = apply_rotary_emb(k.view(bsz, seqlen, self.n_local_heads, self.head_dim), freqs_cis)
        v = v.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        q, k, v = map(lambda x: x.transpose(1, 2), (q, k, v))
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(input_pos, k, v)
        k = k.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        v = v.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
        y = y.transpose(1, 2).contiguous().view(bsz, seqlen, self.dim)
        return self.wo(y)


class KDAAttention(nn.Module):
    """Kimi Delta Attention (gated delta rule, per-channel decays). Prefill runs a reference
    recurrence that leaves checkpoint and rings in the KDACache; decode is one kernel call."""

    def __init__(self, config: ModelArgs):
        super().__init__()
        self.n_head, self.n_v_head, self.head_dim = config.kda_n_head, config.kda_n_v_head, config.kda_head_dim
        key_dim, value_dim = self.n_head * self.head_dim, self.n_v_head * self.head_dim
        self.wqkv = nn.Linear(config.dim, 2 * key_dim + value_dim, bias=False)
        self.f_proj = nn.Linear(config.dim, value_dim, bias=False)
        self.b_proj = nn.Linear(config.dim, self.n_v_head, bias=False)
        self.A_log = nn.Parameter(torch.zeros(self.n_v_head))
        self.dt_bias = nn.Parameter(torch.zeros(value_dim))
        self.wo = nn.Linear(value_dim, config.dim, bias=False)
        self.gate_fn = config.kda_gate_fn
        self.gate_logit_normalizer = config.kda_gate_logit_normalizer
        self.lower_bound = config.kda_lower_bound
        self.scale = self.head_dim**-0.5
        self.kda_cache: Optional[KDACache] = None

    def forward(self, x: Tensor, input_pos: Tensor) -> Tensor:
        mixed_qkv, a, b = self.wqkv(x), self.f_proj(x), self.b_proj(x)
        if x.shape[1] == 1 and self.kda_cache is not None:
            return self._decode(mixed_qkv, a, b)
        return self._prefill(mixed_qkv, a, b)

    def _log_decay(self, a: Tensor) -> Tensor:
        """Per-step log-decays ``[B, T, HV, K]`` from the forget-gate logits."""
        a = a.unflatten(-1, (self.n_v_head, self.head_dim))
        if self.gate_fn == "logsigmoid":
            return F.logsigmoid(a) / self.gate_logit_normalizer  # expect-bug: promotion id=gla-gate
        g = -self.A_log.float().exp()[:, None] * F.softplus(a.float() + self.dt_bias.float().view(self.n_v_head, self.head_dim))
        return g if self.lower_bound is None else g.clamp_min(self.lower_bound)

    def _decode(self, mixed_qkv: Tensor, a: Tensor, b: Tensor) -> Tensor:
        bsz = mixed_qkv.shape[0]
        cache = self.kda_cache
        d_ring, k_ring, g_ring, write_pos = cache.rings()
        out = mixed_qkv.new_zeros(bsz, 1, self.n_v_head, self.head_dim)
        slots = torch.arange(bsz, dtype=torch.int32, device=mixed_qkv.device)
        out, _ = kda_replayssm_decode(mixed_qkv, a, b, self.A_log, self.dt_bias, self.scale, cache.state, d_ring, k_ring, g_ring, out, slots, write_pos, None, True, self.lower_bound)
        return self.wo(out.view(bsz, 1, -1))

    def _prefill(self, mixed_qkv: Tensor, a: Tensor, b: Tensor) -> Tensor:
        bsz, T, _ = mixed_qkv.shape
        H, HV, K = self.n_head, self.n_v_head, self.head_dim
        q, k, v = mixed_qkv.split([H * K, H * K, HV * K], dim=-1)
        k = F.normalize(k.view(bsz, T, H, K).float(), dim=-1)
        q = F.normalize(q.view(bsz, T, H, K).float(), dim=-1).repeat_interleave(HV // H, dim=2)
        k_rep, v = k.repeat_interleave(HV // H, dim=2), v.view(bsz, T, HV, K).float()
        beta, g = b.float().sigmoid(), self._log_decay(a)
        cache = self.kda_cache
        t0 = max(T - cache.ring_len, 0) if cache is not None else T  # steps folded into the checkpoint
        S = cache.state[:bsz].clone() if cache is not None else v.new_zeros(bsz, HV, K, K)
        ckpt, d, o = S, torch.empty_like(v), torch.empty_like(v)
        for t in range(T):
            if t == t0:
                ckpt = S.clone()
            S = S * g[:, t].float().exp()[:, :, None, :]
            d[:, t] = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhvk,bhk->bhv", S, k_rep[:, t]))
            S = S + torch.einsum("bhv,bhk->bhvk", d[:, t], k_rep[:, t])
            o[:, t] = torch.einsum("bhvk,bhk->bhv", S, q[:, t]) * self.scale
        if cache is not None:
            self._fill_rings(cache, ckpt, d[:, t0:], k[:, t0:], g[:, t0:])
        return self.wo(o.to(mixed_qkv.dtype).reshape(bsz, T, HV * K))

    @staticmethod
    def _fill_rings(cache: KDACache, ckpt: Tensor, d: Tensor, k: Tensor, g: Tensor) -> None:
        bsz, n = d.shape[:2]
        cache.state[:bsz] = ckpt
        if n == cache.ring_len and bsz == cache.d_cache.shape[0]:
            # the prompt fills the whole ring: its last ring_len steps become the ring
            cache.d_cache = d.transpose(1, 2).to(cache.d_cache.dtype).contiguous()
            cache.k_cache = k.transpose(1, 2).to(cache.k_cache.dtype).contiguous()
            cache.g_cache = g.transpose(1, 2).contiguous()  # expect-bug: promotion id=gla-gate
        else:
            cache.d_cache[:bsz, :, :n] = d.transpose(1, 2)
            cache.k_cache[:bsz, :, :n] = k.transpose(1, 2)
            cache.g_cache[:bsz, :, :n] = g.transpose(1, 2)
        cache.write_pos[:bsz] = n


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
        x32 = x.float()
        return (x32 * torch.rsqrt(torch.mean(x32 * x32, dim=-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def precompute_freqs_cis(seq_len: int, n_elem: int, base: int = 10000, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    freqs = 1.0 / (base ** (torch.arange(0, n_elem, 2)[: (n_elem // 2)].float() / n_elem))
    freqs = torch.outer(torch.arange(seq_len, device=freqs.device), freqs)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
    return torch.stack([freqs_cis.real, freqs_cis.imag], dim=-1).to(dtype=dtype)


def apply_rotary_emb(x: Tensor, freqs_cis: Tensor) -> Tensor:
    xshaped = x.float().reshape(*x.shape[:-1], -1, 2)
    freqs_cis = freqs_cis.view(1, xshaped.size(1), 1, xshaped.size(3), 2)
    x0, x1, f0, f1 = xshaped[..., 0], xshaped[..., 1], freqs_cis[..., 0], freqs_cis[..., 1]
    x_out2 = torch.stack([x0 * f0 - x1 * f1, x1 * f0 + x0 * f1], -1).flatten(3)
    return x_out2.type_as(x)


def _tiny(name: str = "kda-tiny", precision: torch.dtype = torch.bfloat16, batch_size: int = 2, prompt_len: int = 3):
    model = Transformer.from_name(name).to(dtype=precision)
    model.setup_caches(max_batch_size=batch_size, max_seq_length=16)
    idx = torch.randint(0, model.config.vocab_size, (batch_size, prompt_len))
    with torch.no_grad():
        model(idx, torch.arange(prompt_len))
        model(idx[:, -1:], torch.tensor([prompt_len]))
    return model


def build_bf16_caches():
    return _tiny()


def build_prefill_short_gla():  # shorter than the ring: written into the fp32 ring in place
    return _tiny("kda-tiny-gla", prompt_len=3)


def build_prefill_long():
    return _tiny("kda-tiny", prompt_len=6)


def build_prefill_long_gla():
    return _tiny("kda-tiny-gla", prompt_len=6)


def build_resized_caches():
    model = _tiny(batch_size=1)
    for b in model.layers:
        if b.is_kda:
            b.attention.kda_cache.resize(3)
    return model
