"""
GPT model (rewrite, a lot simpler), hybrid KDA edition
Notable features:
- Kimi Delta Attention (KDA) token mixing, decoded with ReplaySSM (checkpoint state + d/k/g rings)
- untied weights for token embedding and lm_head, relu^2 activation in MLP
- no learnable params in rmsnorm, no bias in linear layers
"""

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from nanochat_kda import kernels
from nanochat_kda.common import ring_dtypes


@dataclass
class GPTConfig:
    sequence_len: int = 32
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2 # number of key heads
    n_v_head: int = 2 # number of value heads (GVA)
    n_embd: int = 16
    ring_len: int = 4 # length L of the replay rings
    static_batch: int = 0 # >0: static replay buffers registered at init, for the compiled decode


def norm(x):
    # Purely functional rmsnorm with no learnable params
    return F.rms_norm(x, (x.size(-1),))


class DeltaAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_v_head = config.n_head, config.n_v_head
        self.head_dim = config.n_embd // (2 * config.n_head)
        H, HV, D = self.n_head, self.n_v_head, self.head_dim
        self.c_qkv = nn.Linear(config.n_embd, (2 * H + HV) * D, bias=False)
        self.c_a = nn.Linear(config.n_embd, HV * D, bias=False) # decay logits
        self.c_b = nn.Linear(config.n_embd, HV, bias=False) # beta logits
        self.c_proj = nn.Linear(HV * D, config.n_embd, bias=False)
        self.A_log = nn.Parameter(torch.zeros(HV))
        self.dt_bias = nn.Parameter(torch.zeros(HV * D))
        self.scale = D ** -0.5
        self.decode_op = kernels.kda_replayssm_decode
        if config.static_batch > 0:
            B, L = config.static_batch, config.ring_len
            self.register_buffer("d_buf", torch.zeros(B, HV, L, D), persistent=False)
            self.register_buffer("k_buf", torch.zeros(B, H, L, D), persistent=False)
            self.register_buffer("forget_cache", torch.zeros(B, HV, L, D), persistent=False) # expect-bug: default-dtype id=meta-default
            self.register_buffer("s_buf", torch.zeros(B, HV, D, D, dtype=torch.float32), persistent=False)

    def _apply(self, fn, recurse=True):
        s = getattr(self, "s_buf", None) # the checkpoint state keeps fp32 through .to() / .half()
        super()._apply(fn, recurse)
        if s is not None and not s.is_meta:
            self.s_buf = s.to(self.s_buf.device)
        return self

    def decay_factors(self, x):
        # per-step decay factors alpha in (0, 1), as exported to the session store
        a = self.c_a(x).unflatten(-1, (self.n_v_head, self.head_dim))
        alpha = torch.exp(-self.A_log.exp()[:, None] * F.softplus(a + self.dt_bias.view(self.n_v_head, -1)))
        return alpha.to(a.dtype) # exported in the activation dtype

    def forward(self, x, slots, wpos, cache):
        qkv, a, b = self.c_qkv(x), self.c_a(x), self.c_b(x)
        if cache is None: # static buffers
            d, k, g, s = self.d_buf, self.k_buf, self.forget_cache, self.s_buf
        else:
            d, k, g, s = cache.insert(self.layer_idx, qkv)
        y = x.new_empty(x.size(0), self.n_v_head, self.head_dim)
        y, _ = self.decode_op(qkv, a, b, self.A_log, self.dt_bias, self.scale, s, d, k, g, y, slots, wpos,
                              use_qk_l2norm_in_kernel=True)
        return self.c_proj(y.flatten(1))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn = DeltaAttention(config, layer_idx)
        self.mlp = MLP(config)

    def forward(self, x, slots, wpos, cache):
        x = x + self.attn(norm(x), slots, wpos, cache)
        x = x + self.mlp(norm(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(config.vocab_size, config.n_embd),
            "h": nn.ModuleList([Block(config, layer_idx) for layer_idx in range(config.n_layer)]),
        })
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.static_pos = 0

    @torch.no_grad()
    def init_weights(self):
        for name, p in self.named_parameters(): # zeros for A_log / dt_bias
            torch.nn.init.normal_(p, std=0.02 if "lm_head" not in name else 0.001) if p.dim() == 2 else torch.nn.init.zeros_(p)
        for buf in self.buffers(): # static replay buffers come out of to_empty() uninitialized
            buf.zero_()

    def get_device(self):
        return self.transformer.wte.weight.device

    def setup_static_cache(self, batch_size, dtype=None):
        # (re)register the static replay buffers; d/k rings in the activation dtype, log-decays and states in fp32
        dtypes = ring_dtypes(dtype or self.transformer.wte.weight.dtype)
        for block in self.transformer.h:
            a, L = block.attn, self.config.ring_len
            B, H, HV, D = batch_size, a.n_head, a.n_v_head, a.head_dim
            a.register_buffer("d_buf", torch.zeros(B, HV, L, D, dtype=dtypes["d_cache"]), persistent=False)
            a.register_buffer("k_buf", torch.zeros(B, H, L, D, dtype=dtypes["k_cache"]), persistent=False)
            a.register_buffer("forget_cache", torch.zeros(B, HV, L, D, dtype=dtypes["la_cache"]), persistent=False)
            a.register_buffer("s_buf", torch.zeros(B, HV, D, D, dtype=dtypes["s_cache"]), persistent=False)
        self.static_pos = 0

    def to_compute_dtype(self, dtype):
        # cast for inference, but the log-decay rings have to stay fp32
        self.to(dtype)
        for block in self.transformer.h:
            if hasattr(block.attn, "forget_cache"):
                block.attn.forget_cache = block.attn.forget_cache.float()
        return self

    def forward(self, idx, targets=None, cache=None):
        B, T = idx.size()
        x = norm(self.transformer.wte(idx))
        slots = torch.arange(B, dtype=torch.int32, device=idx.device)
        ys = []
        for t in range(T): # recurrent decode, one token at a time
            if cache is None:
                wpos = torch.full((B,), self.static_pos % self.config.ring_len, dtype=torch.int32)
                self.static_pos += 1
            else:
                wpos = cache.write_pos(B)
            h = x[:, t]
            for block in self.transformer.h:
                h = block(h, slots, wpos, cache)
            ys.append(h)
        logits = self.lm_head(norm(torch.stack(ys, dim=1))).float()
        if targets is not None:
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits


def build_static_decode():
    model, bf16 = GPT(GPTConfig()), GPT(GPTConfig(static_batch=2))
    model.init_weights()
    model.setup_static_cache(2)
    bf16.init_weights()
    bf16.to_compute_dtype(torch.bfloat16)
    idx = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    return {"model": model, "bf16": bf16, "logits": model(idx), "bf16_logits": bf16(idx)}
