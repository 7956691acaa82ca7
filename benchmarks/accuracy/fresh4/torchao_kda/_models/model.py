# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD 3-Clause license found in the
# LICENSE file in the root directory of this source tree.
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from torchao_kda.ops import kda_replayssm_decode
from torchao_kda.utils import str_to_torch_dtype


@dataclass
class ModelArgs:
    vocab_size: int = 64
    dim: int = 32
    n_layer: int = 2
    n_head: int = 2
    n_v_head: int = 2
    head_dim: int = 8
    v_head_dim: int = 8
    replay_len: int = 4
    static_cache: bool = False
    lower_bound: Optional[float] = None
    precision: str = "bf16"

    @property
    def cache_dtype(self) -> torch.dtype:
        return str_to_torch_dtype(self.precision)

    @classmethod
    def from_name(cls, name: str):
        return cls(**transformer_configs[name])


transformer_configs = {
    "Kimi-Linear-tiny": dict(),
    "Kimi-Linear-tiny-static": dict(static_cache=True),
    "Kimi-Linear-tiny-safe-gate": dict(lower_bound=-5.0),
}


class ReplaySSMCache(nn.Module):
    """Per-slot checkpoint state plus the delta / key / log-alpha replay rings."""

    ring_names = ("d_cache", "k_cache", "log_alpha")

    def __init__(self, max_batch_size, n_head, n_v_head, replay_len, head_dim, v_head_dim, dtype=torch.bfloat16):
        super().__init__()
        B, H, HV, L, K, V = max_batch_size, n_head, n_v_head, replay_len, head_dim, v_head_dim
        self.register_buffer("state", torch.zeros(B, HV, V, K, dtype=torch.float32))
        self.register_buffer("d_cache", torch.zeros(B, HV, L, V, dtype=dtype))
        self.register_buffer("k_cache", torch.zeros(B, H, L, K, dtype=dtype))
        # float32 (default dtype): the kernel cumsums and exponentiates these
        self.register_buffer("log_alpha", torch.zeros(B, HV, L, K))  # expect-bug: default-dtype id=serve-default; default-dtype id=gen-default
        self.register_buffer("write_pos", torch.zeros(B, dtype=torch.int32))

    def resize(self, max_batch_size: int) -> "ReplaySSMCache":
        keep = min(max_batch_size, self.d_cache.shape[0])
        dtype = self.d_cache.dtype
        new = {name: torch.zeros(max_batch_size, *getattr(self, name).shape[1:], dtype=dtype) for name in self.ring_names}  # expect-bug: pool-dtype
        new["state"] = torch.zeros(max_batch_size, *self.state.shape[1:], dtype=torch.float32)
        new["write_pos"] = torch.zeros(max_batch_size, dtype=torch.int32)
        for name, t in new.items():
            t[:keep] = getattr(self, name)[:keep]
            setattr(self, name, t)
        return self

    def fork(self, slot: int, n: int) -> "ReplaySSMCache":
        """A new cache holding ``n`` copies of ``slot`` (beam search)."""
        child = ReplaySSMCache.__new__(type(self))
        nn.Module.__init__(child)
        for name in ("state", "d_cache", "k_cache", "write_pos"):
            child.register_buffer(name, getattr(self, name)[slot : slot + 1].repeat_interleave(n, 0))
        child.register_buffer("log_alpha", child.d_cache.new_zeros(child.k_cache.shape))  # expect-bug: like
        child.log_alpha.copy_(self.log_alpha[slot : slot + 1].expand_as(child.log_alpha))
        return child


class StaticReplaySSMCache(ReplaySSMCache):
    """Cache with a fixed layout for torch.compile / CUDA graphs. ``model.to(dtype)``
    and friends cast the d / k rings but never the state or the log-alpha ring."""

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.state, self.log_alpha = self.state.float(), self.log_alpha.float()
        return self


class KDAAttention(nn.Module):
    def __init__(self, config: ModelArgs):
        super().__init__()
        self.config = config
        H, HV, K, V = config.n_head, config.n_v_head, config.head_dim, config.v_head_dim
        self.wqkv = nn.Linear(config.dim, (2 * H * K + HV * V), bias=False)
        self.wa = nn.Linear(config.dim, HV * K, bias=False)
        self.wb = nn.Linear(config.dim, HV, bias=False)
        self.wo = nn.Linear(HV * V, config.dim, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, HV + 1, dtype=torch.float32)))
        self.dt_bias = nn.Parameter(torch.zeros(HV * K))
        self.cache: Optional[ReplaySSMCache] = None

    def _log_alpha(self, a: Tensor) -> Tensor:
        HV, K = self.config.n_v_head, self.config.head_dim
        x = a.unflatten(-1, (HV, K)) + self.dt_bias.view(HV, K)
        if self.config.lower_bound is not None:
            # Safe gate: a single sigmoid, cheap enough in the activation dtype
            return self.config.lower_bound * torch.sigmoid(self.A_log.exp().view(HV, 1) * x)  # expect-bug: promotion id=safe-gate
        return -self.A_log.float().exp().view(HV, 1) * F.softplus(x.float())

    def prefill(self, x: Tensor, slots: Tensor) -> Tensor:
        c, cache = self.config, self.cache
        B, T, _ = x.shape
        H, HV, K, V, L = c.n_head, c.n_v_head, c.head_dim, c.v_head_dim, c.replay_len
        q, k, v = self.wqkv(x).float().split([H * K, H * K, HV * V], dim=-1)
        q, k = F.normalize(q.view(B, T, H, K), dim=-1), F.normalize(k.view(B, T, H, K), dim=-1)
        v, g, beta = v.view(B, T, HV, V), self._log_alpha(self.wa(x)), self.wb(x).float().sigmoid()
        tail, S, ys, ds = T % L, torch.zeros(B, HV, V, K, dtype=torch.float32), [], []
        for t in range(T):
            if t == T - tail:
                cache.state[slots] = S.to(cache.state.dtype)
            kt = k[:, t].repeat_interleave(HV // H, 1)
            S = S * g[:, t].float().exp()[:, :, None, :]
            d = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhvk,bhk->bhv", S, kt))
            S = S + d[..., None] * kt[..., None, :]
            ys.append(torch.einsum("bhvk,bhk->bhv", S, q[:, t].repeat_interleave(HV // H, 1)) * K**-0.5)
            ds.append(d)
        if tail == 0:
            cache.state[slots] = S.to(cache.state.dtype)
        pad = (0, 0, 0, L - tail)
        d_tail = F.pad(torch.stack(ds, 2)[:, :, T - tail :], pad)
        k_tail, g_tail = F.pad(k[:, T - tail :].transpose(1, 2), pad), F.pad(g[:, T - tail :].transpose(1, 2), pad)
        if slots.numel() == cache.d_cache.shape[0]:
            # every slot is prefilled: rebuild the rings rather than scatter into them
            cache.d_cache, cache.k_cache = d_tail.to(cache.d_cache.dtype), k_tail.to(cache.k_cache.dtype)
            cache.log_alpha = g_tail  # expect-bug: promotion id=safe-gate
        else:
            for name, tail_ in (("d_cache", d_tail), ("k_cache", k_tail), ("log_alpha", g_tail)):
                ring = getattr(cache, name)
                ring[slots] = tail_.to(ring.dtype)
        cache.write_pos[slots] = tail
        return self.wo(torch.stack(ys, 1).reshape(B, T, -1).to(x.dtype))

    def forward(self, x: Tensor, slots: Tensor) -> Tensor:
        if x.shape[1] > 1:
            return self.prefill(x, slots)
        cache, B = self.cache, x.shape[0]
        out = torch.empty(B, self.config.n_v_head * self.config.v_head_dim, dtype=torch.float32)
        x = x.view(B, -1)
        out, _ = kda_replayssm_decode(
            self.wqkv(x), self.wa(x), self.wb(x), self.A_log, self.dt_bias, self.config.head_dim**-0.5,
            cache.state, cache.d_cache, cache.k_cache, cache.log_alpha, out, slots, cache.write_pos,
            use_qk_l2norm_in_kernel=True, lower_bound=self.config.lower_bound,
        )
        return self.wo(out.to(x.dtype)).view(B, 1, -1)


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelArgs):
        super().__init__()
        self.attention = KDAAttention(config)
        self.feed_forward = nn.Sequential(nn.Linear(config.dim, 2 * config.dim, bias=False), nn.SiLU(), nn.Linear(2 * config.dim, config.dim, bias=False))
        self.attention_norm = nn.RMSNorm(config.dim, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(config.dim, eps=1e-5)

    def forward(self, x: Tensor, slots: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x), slots)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, config: ModelArgs):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = nn.RMSNorm(config.dim, eps=1e-5)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)

    @classmethod
    def from_name(cls, name: str):
        return cls(ModelArgs.from_name(name))

    def setup_caches(self, max_batch_size: int, dtype: Optional[torch.dtype] = None):
        c = self.config
        dtype = dtype or self.output.weight.dtype
        cache_cls = StaticReplaySSMCache if c.static_cache else ReplaySSMCache
        for b in self.layers:
            b.attention.cache = cache_cls(max_batch_size, c.n_head, c.n_v_head, c.replay_len, c.head_dim, c.v_head_dim, dtype)

    def forward(self, idx: Tensor, slots: Tensor) -> Tensor:
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, slots)
        return self.output(self.norm(x)).float()


def _run(model: Transformer, prompt: Tensor, steps: int = 2) -> Tensor:
    slots = torch.arange(prompt.shape[0], dtype=torch.int32)
    with torch.no_grad():
        tok = model(prompt, slots)[:, -1].argmax(-1)
        for _ in range(steps):
            tok = model(tok[:, None], slots)[:, -1].argmax(-1)
    return tok


def build_transformer():
    model = Transformer.from_name("Kimi-Linear-tiny-static")
    model.setup_caches(2)
    model = model.to(torch.bfloat16)
    tok = _run(model, torch.tensor([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]]))
    plain = Transformer.from_name("Kimi-Linear-tiny")
    plain.setup_caches(3)
    _run(plain, torch.tensor([[9, 8, 7]]), 3)
    return {"static": model, "tokens": tok, "plain": plain}


def build_cache_ops():
    model = Transformer.from_name("Kimi-Linear-tiny").to(torch.bfloat16)
    model.setup_caches(2)
    _run(model, torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]]))
    cache = model.layers[0].attention.cache
    beams = cache.fork(1, 3)
    safe = Transformer.from_name("Kimi-Linear-tiny-safe-gate").to(torch.bfloat16)
    safe.setup_caches(1)
    _run(safe, torch.tensor([[3, 3, 3, 3, 3, 3]]), 0)
    return {"beams": beams, "resized": model.layers[1].attention.cache.resize(4), "safe": safe}
