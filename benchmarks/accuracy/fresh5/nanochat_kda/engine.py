"""
Engine for efficient inference of our models.

Everything works around token sequences, the engine knows nothing about tokenization.
KDA layers keep a ReplaySSM cache (checkpoint state + d/k/g rings) instead of a KV cache.
"""

import torch
import torch.nn.functional as F

from nanochat_kda.common import compute_dtype, compute_init
from nanochat_kda.gpt import GPT, GPTConfig
from nanochat_kda.kernels import LAST_CALL, ReplayDecode, alloc_rings

RINGS = ("d_cache", "k_cache", "la_cache", "s_cache")


def cache_shapes(batch_size, num_heads, num_v_heads, head_dim, ring_len, num_layers):
    B, H, HV, L, D, N = batch_size, num_heads, num_v_heads, ring_len, head_dim, num_layers
    return {"d_cache": (N, B, HV, L, D), "k_cache": (N, B, H, L, D), "la_cache": (N, B, HV, L, D), "s_cache": (N, B, HV, D, D)}


class ReplayCache:
    """
    Works hand-in-hand with the GPT model to maintain the ReplaySSM cache.
    Note that the .pos advances automatically after the last layer of the Transformer inserts.
    """

    def __init__(self, batch_size, num_heads, num_v_heads, head_dim, ring_len, num_layers):
        self.shapes = cache_shapes(batch_size, num_heads, num_v_heads, head_dim, ring_len, num_layers)
        self.d_cache = self.k_cache = self.la_cache = self.s_cache = None
        self.ring_len, self.n_layers = ring_len, num_layers
        self.pos = 0

    def write_pos(self, B):
        return torch.full((B,), self.pos % self.ring_len, dtype=torch.int32)

    def allocate(self, dtype, device=None):
        # eager allocation, so that the compiled decode sees the final buffers from the start
        for name, t in alloc_rings(self.shapes, dtype, device).items(): # expect-bug: pool-dtype id=alloc-rings
            setattr(self, name, t)
        self.s_cache = self.s_cache.float()
        return self

    def prefill(self, other):
        # prefill from a batch 1 cache (the prompt), replicated across our batch
        assert self.d_cache is None, "Cannot prefill a non-empty replay cache"
        assert other.d_cache is not None, "Cannot prefill with a None replay cache"
        for name in RINGS:
            src = getattr(other, name)
            setattr(self, name, torch.empty(self.shapes[name], dtype=src.dtype, device=src.device))
            getattr(self, name)[:] = src
        self.pos = other.pos

    def insert(self, layer_idx, x):
        # lazy init the cache here because we need to know the dtype/device
        if self.d_cache is None:
            self.d_cache = torch.zeros(self.shapes["d_cache"], dtype=x.dtype, device=x.device)
            self.k_cache = torch.zeros(self.shapes["k_cache"], dtype=x.dtype, device=x.device)
            self.la_cache = torch.zeros(self.shapes["la_cache"], device=x.device) # fp32, the default dtype # expect-bug: default-dtype id=global-default
            self.s_cache = torch.zeros(self.shapes["s_cache"], dtype=torch.float32, device=x.device)
        if layer_idx == self.n_layers - 1:
            self.pos += 1
        return self.d_cache[layer_idx], self.k_cache[layer_idx], self.la_cache[layer_idx], self.s_cache[layer_idx]

    def grow(self, batch_size):
        # more rows joined the batch: new rows start from an empty cache
        N, B = self.n_layers, self.d_cache.size(1)
        d = self.d_cache.new_zeros(N, batch_size, *self.d_cache.shape[2:])
        k = self.k_cache.new_zeros(N, batch_size, *self.k_cache.shape[2:])
        la = d.new_zeros(N, batch_size, *self.la_cache.shape[2:]) # expect-bug: like
        s = self.s_cache.new_zeros(N, batch_size, *self.s_cache.shape[2:])
        for name, new in zip(RINGS, (d, k, la, s)):
            new[:, :B] = getattr(self, name)
            setattr(self, name, new)
        self.shapes = {name: tuple(getattr(self, name).shape) for name in RINGS}

    def move_to(self, ref):
        # move the cache next to the model (ref is one of its parameters)
        self.d_cache, self.k_cache = self.d_cache.to(ref), self.k_cache.to(ref)
        self.la_cache = self.la_cache.to(ref) # expect-bug: cast
        self.s_cache = self.s_cache.to(ref.device)
        return self

    def half_(self):
        # fp16 copy of the rings, for fp16 model replicas
        for name in RINGS[:3]:
            setattr(self, name, getattr(self, name).half()) # expect-bug: cast
        return self


class StaticCache(torch.nn.Module):
    """Replay cache with fixed buffers, for the compiled decode (fixed batch size, moves with .to())."""
    fp32_rings = ("s_cache",) # expect-bug: container id=static-fp32

    def __init__(self, config, batch_size, dtype):
        super().__init__()
        m = config
        shapes = cache_shapes(batch_size, m.n_head, m.n_v_head, m.n_embd // (2 * m.n_head), m.ring_len, m.n_layer)
        for name in RINGS:
            ring_dtype = torch.float32 if name in self.fp32_rings else dtype # expect-bug: container id=static-fp32
            self.register_buffer(name, torch.zeros(shapes[name], dtype=ring_dtype), persistent=False)
        self.ring_len, self.n_layers, self.pos = m.ring_len, m.n_layer, 0

    write_pos, insert = ReplayCache.write_pos, ReplayCache.insert

    def prefill(self, other):
        for name in RINGS:
            getattr(self, name).copy_(getattr(other, name))
        self.pos = other.pos


@torch.inference_mode()
def sample_next_token(logits, rng, temperature=1.0, top_k=None):
    """Sample a single next token from given logits of shape (B, vocab_size). Returns (B, 1)."""
    if temperature == 0.0:
        return torch.argmax(logits, dim=-1, keepdim=True)
    if top_k is not None:
        vals, idx = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1)
        return idx.gather(1, torch.multinomial(F.softmax(vals / temperature, dim=-1), num_samples=1, generator=rng))
    return torch.multinomial(F.softmax(logits / temperature, dim=-1), num_samples=1, generator=rng)


class Engine:

    def __init__(self, model, tokenizer=None, static_batch=0, compile=False):
        self.model = model
        self.tokenizer = tokenizer # needed for tool use, unused here
        self.g_cache = {} # compiled decode steps, keyed by batch size
        device_type = model.get_device().type
        self.static = StaticCache(model.config, static_batch, compute_dtype(device_type)) if static_batch else None
        if compile:
            for block in model.transformer.h:
                block.attn.decode_op = ReplayDecode(compute_dtype(device_type))

    def _new_cache(self, batch_size):
        m = self.model.config
        return ReplayCache(batch_size, m.n_head, m.n_v_head, m.n_embd // (2 * m.n_head), m.ring_len, m.n_layer)

    @torch.inference_mode()
    def generate(self, tokens, num_samples=1, max_tokens=None, temperature=1.0, top_k=None, seed=42):
        """Same as generate, but does single prefill and then clones the replay cache."""
        device = self.model.get_device()
        rng = torch.Generator(device=device)
        rng.manual_seed(seed)
        # 1) Run a batch 1 prefill of the prompt tokens
        cache_prefill = self._new_cache(1)
        ids = torch.tensor([tokens], dtype=torch.long, device=device)
        logits = self.model.forward(ids, cache=cache_prefill)[:, -1, :]
        # 2) Replicate the replay cache for each sample/row
        cache = self.static if self.static is not None else self._new_cache(num_samples)
        cache.prefill(cache_prefill)
        logits = logits.expand(num_samples, -1)
        # 3) Decode
        num_generated = 0
        while max_tokens is None or num_generated < max_tokens:
            next_ids = sample_next_token(logits, rng, temperature, top_k) # (B, 1)
            yield next_ids[:, 0].tolist(), cache
            logits = self.model.forward(next_ids, cache=cache)[:, -1, :]
            num_generated += 1

    def generate_batch(self, tokens, num_samples=1, **kwargs):
        """Non-streaming batch generation that just returns the final token sequences and the cache."""
        results, cache = [tokens.copy() for _ in range(num_samples)], None
        for token_column, cache in self.generate(tokens, num_samples, **kwargs):
            for i, token in enumerate(token_column):
                results[i].append(token)
        return results, cache


def tiny_model(**kwargs):
    model = GPT(GPTConfig(**kwargs))
    model.init_weights()
    return model


def _chat(engine, num_samples=2, max_tokens=3):
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        results, cache = engine.generate_batch([1, 2, 3], num_samples=num_samples, max_tokens=max_tokens)
    return torch.tensor(results), cache


def build_generate():
    results, cache = _chat(Engine(tiny_model()))
    return {"results": results, "cache": cache}


def build_engine_variants():
    out = {}
    _, out["compiled"] = _chat(Engine(tiny_model(), compile=True))
    out["compiled_call"] = dict(LAST_CALL)
    _, out["static"] = _chat(engine := Engine(tiny_model(), static_batch=2))
    out["eager"] = engine._new_cache(2).allocate(torch.bfloat16)
    for name in ("grown", "moved", "halved"):
        _, out[name] = _chat(Engine(tiny_model()))
    out["grown"].grow(3)
    out["moved"].move_to(next(tiny_model().to_compute_dtype(torch.bfloat16).parameters()))
    out["halved"].half_()
    return out


def build_bf16_default():
    compute_init("cpu", seed=0, dtype=torch.bfloat16)
    results, cache = _chat(Engine(tiny_model()), num_samples=1)
    return {"results": results, "cache": cache}
