import torch
from torch import nn
from torch.nn import Module, ModuleList

from .cache import RingCache
from .kda import KimiDeltaAttention, RingState
from .utils import exists, default, default_dtype, eval_decorator

def gumbel_sample(logits, temperature = 1.):
    if temperature <= 0.:
        return logits.argmax(dim = -1)
    noise = -torch.log(-torch.log(torch.rand_like(logits).clamp(1e-20, 1.)))
    return (logits / temperature + noise).argmax(dim = -1)

class KimiLinear(Module):
    def __init__(self, *, num_tokens, dim, depth, ff_mult = 2, stream_batch = None, stream_klass = RingState,
                 **attn_kwargs):
        super().__init__()
        self.token_emb = nn.Embedding(num_tokens, dim)

        self.layers = ModuleList([ModuleList([
            nn.LayerNorm(dim),
            KimiDeltaAttention(dim, **attn_kwargs),
            nn.LayerNorm(dim),
            nn.Sequential(nn.Linear(dim, dim * ff_mult), nn.GELU(), nn.Linear(dim * ff_mult, dim))
        ]) for _ in range(depth)])

        self.norm = nn.LayerNorm(dim)
        self.to_logits = nn.Linear(dim, num_tokens, bias = False)

        # live rings as buffers, for streaming one token at a time without passing caches around
        self.streams = None
        if exists(stream_batch):
            self.streams = ModuleList([stream_klass(attn.ring_spec(), stream_batch) for attn in self.attns])

    @property
    def attns(self):
        return [layer[1] for layer in self.layers]

    @property
    def dtype(self):
        return self.token_emb.weight.dtype

    def init_cache(self, batch):
        """ empty caches for decoding without a prompt, the rings in the compute dtype """
        with default_dtype(self.dtype):  # expect-bug: default-dtype id=empty-cache
            return [RingCache(
                state = torch.zeros(batch, a.heads_v, a.dim_head_v, a.dim_head, dtype = torch.float32),
                delta_mem = torch.zeros(batch, a.heads_v, a.ring_len, a.dim_head_v),
                key_mem = torch.zeros(batch, a.heads, a.ring_len, a.dim_head),
                decay_mem = torch.zeros(batch, a.heads_v, a.ring_len, a.dim_head),  # expect-bug: default-dtype id=empty-cache
                write_pos = torch.zeros(batch, dtype = torch.int32)
            ) for a in self.attns]

    def forward(self, ids, cache = None, return_cache = False):
        x = self.token_emb(ids)
        if exists(cache) and cache[0].delta_mem.dtype != x.dtype:
            # caches prefilled at another precision (say an fp32 prompt pass) follow the decoding dtype
            cache = [RingCache(c.state, *(t.type_as(x) for t in c[1:4]), c.write_pos) for c in cache]  # expect-bug: cast

        next_caches = []
        for (attn_norm, attn, ff_norm, ff), layer_cache in zip(self.layers, default(cache, [None] * len(self.layers))):
            out, layer_cache = attn(attn_norm(x), cache = layer_cache, return_cache = True)
            x = x + out
            x = x + ff(ff_norm(x))
            next_caches.append(layer_cache)

        logits = self.to_logits(self.norm(x))
        return (logits, next_caches) if return_cache else logits

    @torch.no_grad()
    def stream(self, token):
        logits, caches = self.forward(token[:, None], cache = [s.cache for s in self.streams], return_cache = True)
        for stream, cache in zip(self.streams, caches):
            stream.update_(cache)
        return logits[:, -1]

    @torch.inference_mode()
    @eval_decorator
    def generate(self, prompt = None, seq_len = 8, temperature = 0., batch = 1, cache = None):
        if not exists(prompt):
            prompt, cache = torch.zeros(batch, 1, dtype = torch.long), default(cache, lambda: self.init_cache(batch))

        logits, cache = self.forward(prompt, cache = cache, return_cache = True)
        out = prompt

        for _ in range(seq_len):
            sample = gumbel_sample(logits[:, -1], temperature)
            out = torch.cat((out, sample[:, None]), dim = -1)
            logits, cache = self.forward(sample[:, None], cache = cache, return_cache = True)

        return out[:, prompt.shape[-1]:], cache

# builders

def tiny_model(**kwargs):
    return KimiLinear(num_tokens = 32, dim = 16, depth = 2, heads = 1, heads_v = 2, dim_head = 8, ring_len = 4,
                      **kwargs)

@torch.no_grad()
def prompt_caches(model, batch = 2, length = 5):
    return model(torch.randint(0, 32, (batch, length)), return_cache = True)[1]

def build_generate():
    with default_dtype(torch.bfloat16):
        model = tiny_model()
    samples, cache = model.generate(torch.randint(0, 32, (2, 5)), seq_len = 4)
    return dict(samples = samples, cache = cache)

def build_unprompted_generate():
    samples, cache = tiny_model().to(torch.bfloat16).generate(batch = 2, seq_len = 3)
    return dict(samples = samples, cache = cache)
