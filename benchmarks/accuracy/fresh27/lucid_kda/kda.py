import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import Module

from .cache import RingCache, RingSpec
from .ops import fused_recurrent_kda_replayssm_decode
from .utils import exists, default, l2norm, rearrange

class KimiDeltaAttention(Module):
    def __init__(self, dim, *, heads = 4, dim_head = 16, heads_v = None, dim_head_v = None, ring_len = 16,
                 gate_lower_bound = None, use_qk_l2norm = True):
        super().__init__()
        self.heads, self.dim_head, self.ring_len = heads, dim_head, ring_len
        self.heads_v, self.dim_head_v = default(heads_v, heads), default(dim_head_v, dim_head)
        assert (self.heads_v % heads) == 0
        self.scale, self.gate_lower_bound, self.use_qk_l2norm = dim_head ** -0.5, gate_lower_bound, use_qk_l2norm
        self.to_qk = nn.Linear(dim, heads * dim_head * 2, bias = False)
        self.to_v = nn.Linear(dim, self.heads_v * self.dim_head_v, bias = False)
        self.to_gate = nn.Linear(dim, self.heads_v * dim_head)
        self.to_beta = nn.Linear(dim, self.heads_v)
        self.A_log = nn.Parameter(torch.zeros(self.heads_v, 1))
        self.to_out = nn.Linear(self.heads_v * self.dim_head_v, dim, bias = False)

    @property
    def cache_kwargs(self):
        return dict(heads = self.heads, heads_v = self.heads_v, dim_k = self.dim_head, dim_v = self.dim_head_v,
                    ring_len = self.ring_len)

    def ring_spec(self, dtype = torch.float32):
        return RingSpec(**self.cache_kwargs, dtype = dtype)

    def log_decay(self, x):
        gate_logits = rearrange(self.to_gate(x), 'b n (h d) -> b n h d', h = self.heads_v)
        if exists(self.gate_lower_bound):
            return self.gate_lower_bound * gate_logits.sigmoid()  # expect-bug: promotion
        return -self.A_log.float().exp() * F.softplus(gate_logits.float())

    def project(self, x):
        q, k = rearrange(self.to_qk(x), 'b n (qk h d) -> qk b n h d', qk = 2, h = self.heads)
        v = rearrange(self.to_v(x), 'b n (h d) -> b n h d', h = self.heads_v)
        beta = self.to_beta(x).sigmoid()
        return q, k, v, self.log_decay(x), beta

    def merge_heads(self, out):
        return self.to_out(rearrange(out, 'b n h d -> b n (h d)'))

    def step(self, x, **ring_kwargs):
        """ one token per row against rings the caller owns, passed with the kernel's keyword names """
        q, k, v, g, beta = self.project(x)
        out = fused_recurrent_kda_replayssm_decode(q, k, v, g, beta, scale = self.scale,
                                                   use_qk_l2norm_in_kernel = self.use_qk_l2norm, **ring_kwargs)
        return self.merge_heads(out.to(x.dtype))

    def decode(self, q, k, v, g, beta, cache):
        out = fused_recurrent_kda_replayssm_decode(
            q = q, k = k, v = v, g = g, beta = beta, scale = self.scale,
            initial_state = cache.state, d_cache = cache.delta_mem, k_cache = cache.key_mem, g_cache = cache.decay_mem,
            ssm_state_indices = torch.arange(q.shape[0], dtype = torch.int32), write_pos = cache.write_pos,
            use_qk_l2norm_in_kernel = self.use_qk_l2norm
        )
        return out, cache._replace(write_pos = (cache.write_pos + 1) % self.ring_len)

    def prefill(self, q, k, v, g, beta):
        """ naive recurrence in float32 - tokens past the last full ring are kept as ring rows to replay """
        (b, n), groups = q.shape[:2], self.heads_v // self.heads
        tail = n % self.ring_len
        qf, kf = (l2norm(t.float()) if self.use_qk_l2norm else t.float() for t in (q, k))
        qr, kr = (t.repeat_interleave(groups, dim = 2) for t in (qf, kf))
        vf, betaf = v.float(), beta.float()

        state = torch.zeros(b, self.heads_v, self.dim_head_v, self.dim_head)
        checkpoint, outs, deltas = state, [], []

        for t in range(n):
            state = state * g[:, t].float().exp()[..., None, :]
            delta = betaf[:, t, :, None] * (vf[:, t] - torch.einsum('bhvk,bhk->bhv', state, kr[:, t]))
            state = state + delta[..., None] * kr[:, t, :, None, :]
            outs.append(torch.einsum('bhvk,bhk->bhv', state, qr[:, t]) * self.scale)
            deltas.append(delta)
            if t == n - tail - 1:
                checkpoint = state

        rows = lambda t: F.pad(rearrange(t[:, n - tail:], 'b n h d -> b h n d'), (0, 0, 0, self.ring_len - tail))
        cache = RingCache(
            state = checkpoint.clone(),
            delta_mem = rows(torch.stack(deltas, dim = 1)).to(v.dtype),
            key_mem = rows(kf).to(k.dtype),
            decay_mem = rows(g),
            write_pos = torch.full((b,), tail, dtype = torch.int32)
        )
        return torch.stack(outs, dim = 1), cache

    def forward(self, x, cache = None, return_cache = True):
        qkvgb = self.project(x)
        assert not exists(cache) or x.shape[1] == 1, 'a cached call decodes one token at a time'
        out, next_cache = self.decode(*qkvgb, cache) if exists(cache) else self.prefill(*qkvgb)
        out = self.merge_heads(out.to(x.dtype))
        return (out, next_cache) if return_cache else out

class RingState(Module):
    """ the live rings of one stream as non-persistent buffers, so they follow the module around """

    def __init__(self, spec: RingSpec, batch = 1):
        super().__init__()
        for name, (shape, dtype) in spec.rings.items():
            self.register_buffer(name, torch.zeros(batch, *shape, dtype = dtype), persistent = False)
        self.register_buffer('write_pos', torch.zeros(batch, dtype = torch.int32), persistent = False)

    @property
    def cache(self):
        return RingCache(*(getattr(self, name) for name in RingCache._fields))

    def update_(self, cache):
        for name, t in cache._asdict().items():
            getattr(self, name).copy_(t)
        return self

    def reset(self):
        self.state = torch.zeros_like(self.state)
        self.delta_mem = torch.zeros_like(self.delta_mem)
        self.key_mem = torch.zeros_like(self.key_mem)
        self.decay_mem = torch.zeros_like(self.delta_mem)  # expect-bug: like
        self.write_pos = torch.zeros_like(self.write_pos)

class FP32RingState(RingState):
    """ keeps the checkpoint and the log decays in float32 through .to(dtype) / .half() / .bfloat16() """
    keep_fp32 = ('state', 'decay_mem')

    def _apply(self, fn, recurse = True):
        kept = {name: getattr(self, name) for name in self.keep_fp32}
        super()._apply(fn, recurse)
        for name, t in kept.items():
            setattr(self, name, t.to(getattr(self, name).device))
        return self

# builders

def tiny_attention(**kwargs):
    return KimiDeltaAttention(16, heads = 1, heads_v = 2, dim_head = 8, ring_len = 4, **kwargs)

@torch.no_grad()
def prefill_then_decode(attn, steps = 3):
    out, cache = attn(torch.randn(2, 6, 16, dtype = torch.bfloat16))
    for _ in range(steps):
        step_out, cache = attn(torch.randn(2, 1, 16, dtype = torch.bfloat16), cache = cache)
    return dict(out = out, step_out = step_out, cache = cache)

def build_attention_prefill_decode():
    return prefill_then_decode(tiny_attention().to(torch.bfloat16))

def build_bounded_gate_prefill():
    return prefill_then_decode(tiny_attention(gate_lower_bound = -5.).bfloat16())

def build_stream_state_through_cast():
    spec = tiny_attention().ring_spec()
    return dict(bf16 = FP32RingState(spec, batch = 2).to(torch.bfloat16), fp32 = RingState(spec, batch = 2))

def build_stream_reset():
    stream = FP32RingState(tiny_attention().ring_spec(), batch = 2).to(torch.bfloat16)
    stream.reset()
    return stream
