import functools
from typing import Type

import torch
import torch.nn as nn
import torch.nn.functional as F

from .args import TransformerArgs
from .cache import ReplayCacheView
from .lora import LoRALinear
from .replayssm import fused_recurrent_kda_replayssm_decode


def maybe_lora(args: TransformerArgs) -> Type[nn.Linear]:
    if args.lora is None:
        return nn.Linear
    return functools.partial(LoRALinear, rank=args.lora.rank, scaling=args.lora.scaling)  # type: ignore


class KimiDeltaAttention(nn.Module):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        kda = args.kda
        self.n_heads, self.n_v_heads = kda.num_heads, kda.num_v_heads
        self.head_k_dim, self.head_v_dim = kda.head_k_dim, kda.head_v_dim
        self.replay_len, self.lower_bound, self.use_qk_l2norm = kda.replay_len, kda.lower_bound, kda.use_qk_l2norm
        self.scale = self.head_k_dim ** -0.5
        MaybeLora = maybe_lora(args)
        self.wq = MaybeLora(args.dim, self.n_heads * self.head_k_dim, bias=False)
        self.wk = MaybeLora(args.dim, self.n_heads * self.head_k_dim, bias=False)
        self.wv = MaybeLora(args.dim, self.n_v_heads * self.head_v_dim, bias=False)
        self.wo = MaybeLora(self.n_v_heads * self.head_v_dim, args.dim, bias=False)
        self.wf = nn.Linear(args.dim, self.n_v_heads * self.head_k_dim, bias=False)  # gate logits
        self.wb = nn.Linear(args.dim, self.n_v_heads, bias=False)  # beta logits
        self.A_log = nn.Parameter(torch.zeros(self.n_v_heads))
        self.dt_bias = nn.Parameter(torch.zeros(self.n_v_heads * self.head_k_dim))

    def forward(self, x: torch.Tensor, cache: ReplayCacheView) -> torch.Tensor:
        # x: [num_toks, dim], the sequences of the batch one after the other
        mixed_qkv = torch.cat([self.wq(x), self.wk(x), self.wv(x)], dim=-1)
        a, b = self.wf(x), self.wb(x)
        seqlens = cache.metadata.seqlens
        if not cache.metadata.prefill:
            out = self._decode(mixed_qkv, a, b, cache)
        elif max(seqlens) <= self.replay_len and len(set(seqlens)) == 1:
            out = self._prefill_by_steps(mixed_qkv, a, b, cache)
        else:
            out = self._prefill_chunked(mixed_qkv, a, cache)
        return self.wo(out.flatten(1))

    def _decode(self, mixed_qkv, a, b, view: ReplayCacheView) -> torch.Tensor:
        out = mixed_qkv.new_zeros(mixed_qkv.shape[0], self.n_v_heads, self.head_v_dim)
        out, _ = fused_recurrent_kda_replayssm_decode(
            mixed_qkv=mixed_qkv, a=a, b=b, A_log=self.A_log, dt_bias=self.dt_bias, scale=self.scale,
            initial_state=view.state, d_cache=view.delta, k_cache=view.key, g_cache=view.gate, out=out,
            ssm_state_indices=view.metadata.slot_indices, write_pos=view.write_pos,
            use_qk_l2norm_in_kernel=self.use_qk_l2norm, lower_bound=self.lower_bound,
        )
        return out

    def _prefill_by_steps(self, mixed_qkv, a, b, view: ReplayCacheView) -> torch.Tensor:
        """Prompts of at most ``replay_len`` tokens: the decode kernel, one token of every sequence at
        a time, is cheaper than a chunked launch."""
        n_seqs, seqlen = len(view.metadata.seqlens), view.metadata.seqlens[0]
        rings = dict(zip(("d_cache", "k_cache", "g_cache"), view.rings))  # expect-bug: decode-arg
        step = functools.partial(
            fused_recurrent_kda_replayssm_decode, A_log=self.A_log, dt_bias=self.dt_bias, scale=self.scale,
            initial_state=view.state, ssm_state_indices=view.metadata.slot_indices, write_pos=view.write_pos,
            use_qk_l2norm_in_kernel=self.use_qk_l2norm, lower_bound=self.lower_bound, **rings,
        )
        outs = []
        for t in range(seqlen):
            rows = torch.arange(n_seqs, device=mixed_qkv.device) * seqlen + t
            out = mixed_qkv.new_zeros(n_seqs, self.n_v_heads, self.head_v_dim)
            outs.append(step(mixed_qkv[rows], a[rows], b[rows], out=out)[0])
        return torch.stack(outs, dim=1).flatten(0, 1)

    def _prefill_chunked(self, mixed_qkv, a, view: ReplayCacheView) -> torch.Tensor:
        """The chunked kernel (skipped on CPU, the outputs are zero) leaves the state at the start of
        each sequence's last ``replay_len`` steps; the rings get those steps."""
        qk_size = self.n_heads * self.head_k_dim
        _, k, v = mixed_qkv.split([qk_size, qk_size, self.n_v_heads * self.head_v_dim], dim=-1)
        a = a.float().unflatten(-1, (self.n_v_heads, self.head_k_dim))
        dt_bias = self.dt_bias.float().view(self.n_v_heads, self.head_k_dim)
        g = -self.A_log.float().exp()[:, None] * F.softplus(a + dt_bias)
        start = 0
        for i, seqlen in enumerate(view.metadata.seqlens):
            n = min(seqlen, self.replay_len)
            tail = slice(start + seqlen - n, start + seqlen)
            view.key[i, :, :n] = k[tail].unflatten(-1, (self.n_heads, self.head_k_dim)).transpose(0, 1)
            view.delta[i, :, :n] = v[tail].unflatten(-1, (self.n_v_heads, self.head_v_dim)).transpose(0, 1)
            view.gate[i, :, :n] = g[tail].transpose(0, 1)
            view.write_pos[i] = n % self.replay_len
            start += seqlen
        return mixed_qkv.new_zeros(mixed_qkv.shape[0], self.n_v_heads, self.head_v_dim)


class FeedForward(nn.Module):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        MaybeLora = maybe_lora(args)
        self.w1 = MaybeLora(args.dim, args.hidden_dim, bias=False)
        self.w2 = MaybeLora(args.hidden_dim, args.dim, bias=False)
        self.w3 = MaybeLora(args.dim, args.hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class TransformerBlock(nn.Module):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        self.attention = KimiDeltaAttention(args)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor, cache: ReplayCacheView) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cache)
        return h + self.feed_forward(self.ffn_norm(h))
