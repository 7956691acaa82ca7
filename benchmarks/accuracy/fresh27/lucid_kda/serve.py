""" continuous batching over fixed slots, and a static decoder whose buffers are bound once """

from functools import partial

import torch

from .cache import RingCache
from .ops import fused_recurrent_kda_replayssm_decode
from .transformer import tiny_model
from .utils import default

class Server:
    def __init__(self, model, num_slots = 4, dtype = None):
        self.model, self.free, self.pools = model, list(range(num_slots)), []
        dtype = default(dtype, model.dtype)
        for attn in model.attns:
            shapes = {name: (num_slots, *shape) for name, (shape, _) in attn.ring_spec().rings.items()}
            rings = {name: torch.zeros(shapes[name], dtype = dtype) for name in ('delta_mem', 'key_mem', 'decay_mem')}  # expect-bug: pool-dtype
            write_pos = torch.zeros(num_slots, dtype = torch.int32)
            self.pools.append(RingCache(state = torch.zeros(shapes['state']), write_pos = write_pos, **rings))

    @torch.no_grad()
    def admit(self, prompt):
        """ prefill one request and copy its caches into a free slot of every pool """
        slot = self.free.pop(0)
        _, caches = self.model(prompt[None], return_cache = True)
        for pool, cache in zip(self.pools, caches):
            for ring, row in zip(pool, cache):
                ring[slot] = row[0]
        return slot

    @torch.no_grad()
    def step(self, tokens, slots):
        """ one token for each (token, slot) pair """
        x, index = self.model.token_emb(tokens[:, None]), slots.long()
        for (attn_norm, attn, ff_norm, ff), pool in zip(self.model.layers, self.pools):
            write_pos = pool.write_pos[index]
            x = x + attn.step(attn_norm(x), initial_state = pool.state, d_cache = pool.delta_mem,
                              k_cache = pool.key_mem, g_cache = pool.decay_mem, ssm_state_indices = slots,
                              write_pos = write_pos)
            pool.write_pos[index] = (write_pos + 1) % attn.ring_len
            x = x + ff(ff_norm(x))
        return self.model.to_logits(self.model.norm(x))[:, -1]

class StaticDecoder:
    """ decode buffers allocated once per layer and bound into the kernel, cuda-graph style """

    def __init__(self, model, batch = 1, dtype = None):
        self.model, self.buffers, self.kernels = model, [], []
        dtype = default(dtype, model.dtype)
        for a in model.attns:
            forget_buf = torch.zeros(batch, a.heads_v, a.ring_len, a.dim_head, dtype = dtype)  # expect-bug: decode-arg id=static
            buffers = dict(
                initial_state = torch.zeros(batch, a.heads_v, a.dim_head_v, a.dim_head, dtype = torch.float32),
                d_cache = torch.zeros(batch, a.heads_v, a.ring_len, a.dim_head_v, dtype = dtype),
                k_cache = torch.zeros(batch, a.heads, a.ring_len, a.dim_head, dtype = dtype),
                g_cache = forget_buf  # expect-bug: decode-arg id=static
            )
            self.buffers.append(buffers)
            self.kernels.append(partial(fused_recurrent_kda_replayssm_decode, **buffers, scale = a.scale))
        self.slots = torch.arange(batch, dtype = torch.int32)
        self.write_pos = torch.zeros(batch, dtype = torch.int32)

    @torch.no_grad()
    def step(self, tokens):
        x = self.model.token_emb(tokens[:, None])
        for (attn_norm, attn, ff_norm, ff), kernel in zip(self.model.layers, self.kernels):
            out = kernel(*attn.project(attn_norm(x)), ssm_state_indices = self.slots, write_pos = self.write_pos)
            x = x + attn.merge_heads(out.to(x.dtype))
            x = x + ff(ff_norm(x))
        self.write_pos.add_(1).remainder_(self.model.attns[0].ring_len)
        return self.model.to_logits(self.model.norm(x))[:, -1]

# builders

def serve_a_few(server):
    slots = torch.tensor([server.admit(torch.randint(0, 32, (length,))) for length in (3, 6)], dtype = torch.int32)
    logits = torch.stack([server.step(torch.randint(0, 32, (2,)), slots) for _ in range(3)])
    return dict(pools = server.pools, logits = logits)

def build_server_fp32():
    return serve_a_few(Server(tiny_model(), num_slots = 3, dtype = torch.float32))

def build_server_bf16():
    return serve_a_few(Server(tiny_model().to(torch.bfloat16), num_slots = 3))

def build_static_decoder():
    decoder = StaticDecoder(tiny_model().to(torch.bfloat16), batch = 2)
    logits = torch.stack([decoder.step(torch.randint(0, 32, (2,))) for _ in range(5)])
    return dict(buffers = decoder.buffers, write_pos = decoder.write_pos, logits = logits)
