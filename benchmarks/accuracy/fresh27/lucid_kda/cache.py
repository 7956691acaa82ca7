from typing import NamedTuple, Optional

import torch
from torch import Tensor

from .utils import exists, default, ring_dtypes, GATE_DTYPE

class RingCache(NamedTuple):
    state: Tensor       # (b, hv, dv, dk) float32 checkpoint
    delta_mem: Tensor   # (b, hv, L, dv) model dtype
    key_mem: Tensor     # (b, h, L, dk) model dtype
    decay_mem: Tensor   # (b, hv, L, dk) per step log decays, float32
    write_pos: Tensor   # (b,) int32 ring cursor

class RingSpec(NamedTuple):
    heads: int
    dim_k: int
    dim_v: int
    heads_v: Optional[int] = None
    ring_len: int = 16
    dtype: torch.dtype = torch.float32

    @property
    def rings(self):
        """ name -> (shape without the batch, dtype) """
        heads_v = default(self.heads_v, self.heads)
        return dict(
            state = ((heads_v, self.dim_v, self.dim_k), torch.float32),
            delta_mem = ((heads_v, self.ring_len, self.dim_v), self.dtype),
            key_mem = ((self.heads, self.ring_len, self.dim_k), self.dtype),
            decay_mem = ((heads_v, self.ring_len, self.dim_k), self.dtype),  # expect-bug: container
        )

def init_ring_cache(batch, *, heads, dim_k, dim_v, heads_v = None, ring_len = 16, dtype = torch.bfloat16,
                    gate_dtype = None):
    heads_v = default(heads_v, heads)
    delta_dtype, key_dtype, decay_dtype = ring_dtypes(dtype, gate_dtype)
    return RingCache(
        state = torch.zeros(batch, heads_v, dim_v, dim_k),
        delta_mem = torch.zeros(batch, heads_v, ring_len, dim_v, dtype = delta_dtype),
        key_mem = torch.zeros(batch, heads, ring_len, dim_k, dtype = key_dtype),
        decay_mem = torch.zeros(batch, heads_v, ring_len, dim_k, dtype = decay_dtype),  # expect-bug: imported-policy id=ring-dtypes
        write_pos = torch.zeros(batch, dtype = torch.int32)
    )

def cache_to(cache, device = None, dtype = None):
    """ move a cache, recasting only the delta / key rings """
    recast = lambda name: exists(dtype) and name in ('delta_mem', 'key_mem')
    return RingCache(**{name: t.to(device, dtype if recast(name) else t.dtype) for name, t in cache._asdict().items()})

def compress_cache(cache, dtype = torch.float16):
    """ park an idle request on the host in half precision - the checkpoint stays float32 """
    return cache._replace(**{name: getattr(cache, name).to(dtype) for name in ('delta_mem', 'key_mem', 'decay_mem')})  # expect-bug: cast

def decompress_cache(cache, dtype):
    delta_mem, key_mem = cache.delta_mem.to(dtype), cache.key_mem.to(dtype)
    return cache._replace(delta_mem = delta_mem, key_mem = key_mem, decay_mem = cache.decay_mem.float())

def resize_rings(cache, ring_len):
    """ grow the replay window of a live cache, rows already written keep their positions """
    batch, heads_v, old_len, dim_v = cache.delta_mem.shape
    assert ring_len >= old_len
    delta_mem = cache.delta_mem.new_zeros(batch, heads_v, ring_len, dim_v)
    key_mem = cache.key_mem.new_zeros(batch, cache.key_mem.shape[1], ring_len, cache.key_mem.shape[-1])
    decay_mem = delta_mem.new_zeros(batch, heads_v, ring_len, cache.decay_mem.shape[-1])  # expect-bug: like
    for new, old in zip((delta_mem, key_mem, decay_mem), cache[1:4]):
        new[:, :, :old_len] = old
    return cache._replace(delta_mem = delta_mem, key_mem = key_mem, decay_mem = decay_mem)

def cache_bytes(cache):
    """ raw byte views of every ring, for host <-> device copies that should not care about dtypes """
    return {f'{name}_bytes': t.reshape(-1).view(torch.uint8) for name, t in cache._asdict().items()}

# builders

TINY = dict(heads = 1, heads_v = 2, dim_k = 4, dim_v = 4, ring_len = 4)

def build_ring_cache():
    cache = init_ring_cache(2, **TINY, dtype = torch.bfloat16, gate_dtype = GATE_DTYPE)
    cache.decay_mem.copy_(-torch.rand(cache.decay_mem.shape))
    return dict(
        cache = cache,
        half_rings = cache_to(cache, dtype = torch.float16),
        parked_and_back = decompress_cache(compress_cache(cache), torch.bfloat16),
        raw = cache_bytes(cache),
        nbytes = {name: t.nbytes for name, t in cache._asdict().items()}
    )

def build_default_gate_cache():
    return init_ring_cache(2, **TINY, dtype = torch.bfloat16)

def build_offloaded_cache():
    cache = init_ring_cache(2, **TINY, dtype = torch.bfloat16, gate_dtype = torch.float32)
    return dict(live = cache, offloaded = compress_cache(cache))
