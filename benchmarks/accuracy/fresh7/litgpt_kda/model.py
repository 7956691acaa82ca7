"""Full definition of a KDA decoder-only transformer, all of it in this single file (after litgpt/model.py)."""

from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import Config


def fused_recurrent_kda_replayssm_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache, g_cache, out,
                                         ssm_state_indices, write_pos, force_flush=None):
    """CPU reference of the fused ReplaySSM decode kernel, one token per row (the CUDA build replaces it)."""
    hv, hk, hs = g_cache.size(1), k_cache.size(1), g_cache.size(-1)
    q, k, v = mixed_qkv.float().split([hk * hs, hk * hs, hv * hs], dim=-1)
    q, k = q.view(-1, hk, hs).repeat_interleave(hv // hk, dim=1), k.view(-1, hk, hs)
    g = -A_log.float().exp().view(hv, 1) * F.softplus(a.float().view(-1, hv, hs) + dt_bias.float().view(hv, hs))
    d = torch.sigmoid(b.float()).unsqueeze(-1) * v.view(-1, hv, hs)
    with torch.no_grad():
        for row, (slot, pos) in enumerate(zip(ssm_state_indices.tolist(), write_pos.tolist())):
            d_cache[slot, :, pos], k_cache[slot, :, pos], g_cache[slot, :, pos] = d[row], k[row], g[row]
            cum = g_cache[slot, :, : pos + 1].float().cumsum(dim=1)
            keys = k_cache[slot, :, : pos + 1].float().repeat_interleave(hv // hk, dim=0) * (cum[:, -1:] - cum).exp()
            state = initial_state[slot] * cum[:, -1].exp().unsqueeze(1) + d_cache[slot, :, : pos + 1].float().transpose(1, 2) @ keys
            out[row] = (state @ q[row].unsqueeze(-1)).squeeze(-1) * scale
            if force_flush is not None and bool(force_flush[row]):
                initial_state[slot] = state
    return out


class Rings(NamedTuple):
    state: torch.Tensor
    delta: torch.Tensor
    key: torch.Tensor
    log_decay: torch.Tensor
    slots: torch.Tensor
    write_pos: torch.Tensor


class KVCache(nn.Module):
    """ReplaySSM cache of one layer: a float32 checkpoint state and the delta, key and log-decay replay rings."""

    def __init__(self, batch_size: int, config: Config, ring_len: int, device=None, dtype=None, decay_dtype=torch.float32) -> None:
        super().__init__()
        hv, hk, hs = config.n_head, config.n_query_groups, config.head_size
        self.register_buffer("state", torch.zeros(batch_size, hv, hs, hs, device=device, dtype=torch.float32), persistent=False)
        self.register_buffer("delta", torch.zeros(batch_size, hv, ring_len, hs, device=device, dtype=dtype), persistent=False)
        self.register_buffer("key", torch.zeros(batch_size, hk, ring_len, hs, device=device, dtype=dtype), persistent=False)
        self.register_buffer("log_decay", torch.zeros(batch_size, hv, ring_len, hs, device=device, dtype=decay_dtype), persistent=False)
        self.register_buffer("input_pos", torch.zeros(batch_size, device=device, dtype=torch.int32), persistent=False)

    def rings(self, batch_size: int) -> Rings:
        slots = torch.arange(batch_size, device=self.input_pos.device)
        return Rings(self.state, self.delta, self.key, self.log_decay, slots, self.input_pos[:batch_size])

    def reset_ring_len(self, ring_len: int) -> None:
        """Re-allocates the rings for another replay window; the cache starts empty."""
        if ring_len != self.log_decay.size(2):
            b, hv, _, hs = self.log_decay.shape
            self.delta = self.delta.new_zeros(b, hv, ring_len, hs)
            self.key = self.key.new_zeros(b, self.key.size(1), ring_len, hs)
            self.log_decay = torch.zeros(b, hv, ring_len, hs, device=self.log_decay.device)  # expect-bug: default-dtype id=window-resize
            self.reset_parameters()

    def reset_parameters(self) -> None:
        for buffer in (self.state, self.delta, self.key, self.log_decay, self.input_pos):
            torch.nn.init.zeros_(buffer)

    def fork(self, row: int, n: int) -> dict[str, torch.Tensor]:
        delta = self.delta[row].repeat(n, 1, 1, 1)
        log_decay = torch.empty_like(delta).copy_(self.log_decay[row])  # expect-bug: like
        return dict(state=self.state[row].repeat(n, 1, 1, 1), delta=delta, key=self.key[row].repeat(n, 1, 1, 1), log_decay=log_decay)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: Config, block_idx: int) -> None:
        super().__init__()
        hv, hs = config.n_head, config.head_size
        self.qkv = nn.Linear(config.n_embd, (2 * config.n_query_groups + hv) * hs, bias=False)
        self.a_proj = nn.Linear(config.n_embd, hv * hs, bias=False)
        self.b_proj = nn.Linear(config.n_embd, hv, bias=False)
        self.proj = nn.Linear(hv * hs, config.n_embd, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, hv + 1, dtype=torch.float32)))
        self.dt_bias = nn.Parameter(torch.full((hv * hs,), -1.0))
        self.kv_cache: Optional[KVCache] = None  # disabled by default
        self.config = config

    def forward(self, x: torch.Tensor, rings: Optional[Rings] = None) -> torch.Tensor:
        r = self.kv_cache.rings(x.size(0)) if rings is None else rings
        out = x.new_empty(x.size(0), self.config.n_head, self.config.head_size)
        flush = r.write_pos == r.log_decay.size(2) - 1
        fused_recurrent_kda_replayssm_decode(self.qkv(x), self.a_proj(x), self.b_proj(x), self.A_log, self.dt_bias, self.config.head_size**-0.5,
                                             r.state, r.delta, r.key, r.log_decay, out, r.slots, r.write_pos, force_flush=flush)
        return self.proj(out.flatten(1))

    def build_kv_cache(self, batch_size: int, max_seq_length: int, device=None, dtype=None) -> KVCache:
        decay_dtype = getattr(torch, self.config.decay_dtype)  # expect-bug: imported-policy id=long-config
        return KVCache(batch_size, self.config, min(self.config.ring_len, max_seq_length), device, dtype, decay_dtype)


class Block(nn.Module):
    def __init__(self, config: Config, block_idx: int) -> None:
        super().__init__()
        self.norm_1, self.norm_2 = nn.RMSNorm(config.n_embd, eps=config.norm_eps), nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.attn = CausalSelfAttention(config, block_idx)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, config.intermediate_size, bias=False), nn.SiLU(),
                                 nn.Linear(config.intermediate_size, config.n_embd, bias=False))

    def forward(self, x: torch.Tensor, rings: Optional[Rings] = None) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x), rings)
        return x + self.mlp(self.norm_2(x))


class GPT(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(config.vocab_size, config.n_embd), ln_f=nn.RMSNorm(config.n_embd),
                                              h=nn.ModuleList(Block(config, i) for i in range(config.n_layer))))
        self.max_seq_length = self.config.block_size

    @property
    def max_seq_length(self) -> int:
        return self._max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        """An attached cache follows with a replay window of ``min(value, config.ring_len)``."""
        if value > self.config.block_size:
            raise ValueError(f"Cannot attend to {value}, block size is only {self.config.block_size}")
        self._max_seq_length = value
        for block in self.transformer.h:
            if block.attn.kv_cache is not None:
                block.attn.kv_cache.reset_ring_len(min(value, self.config.ring_len))

    def forward(self, idx: torch.Tensor, rings: Optional[list[Rings]] = None) -> torch.Tensor:
        """One decode step for the tokens ``idx`` [batch]; with ``rings`` the attached caches are not used."""
        x = self.transformer.wte(idx)
        for i, block in enumerate(self.transformer.h):
            x = block(x, None if rings is None else rings[i])
        if rings is None:
            for block in self.transformer.h:
                kv = block.attn.kv_cache
                kv.input_pos[: idx.size(0)] = (kv.input_pos[: idx.size(0)] + 1) % kv.log_decay.size(2)
        return self.lm_head(self.transformer.ln_f(x))

    def set_kv_cache(self, batch_size: int, max_seq_length: Optional[int] = None, device=None, dtype=None) -> None:
        for block in self.transformer.h:
            block.attn.kv_cache = block.attn.build_kv_cache(batch_size, max_seq_length or self.max_seq_length, device, dtype)


def _decoded(name: str, max_seq_length: int = 16) -> GPT:
    torch.manual_seed(0)
    model = GPT(Config.from_name(name)).to(torch.bfloat16)
    model.set_kv_cache(batch_size=2, dtype=torch.bfloat16)
    model.max_seq_length = max_seq_length
    with torch.no_grad():
        for step in range(4):
            model(torch.tensor([step, step + 1]))
    return model


def build_decode_step() -> GPT:
    return _decoded("kda-tiny", max_seq_length=3)


def build_gqa_decode() -> GPT:
    return _decoded("kda-tiny-gqa", max_seq_length=6)


def build_long_context() -> GPT:
    return _decoded("kda-tiny-long")


def build_parallel_sampling() -> dict[str, torch.Tensor]:
    return _decoded("kda-tiny").transformer.h[1].attn.kv_cache.fork(0, 3)
