"""Ring caches of the batched path as modules, one ``[n_layer, slots, ...]`` buffer per tensor kind.

``PinnedRingCache`` may be cast (``.to(dtype)``, ``.half()``): its checkpoint and log-decay ring
stay float32 and only change device.
"""

import types
from typing import NamedTuple

import torch

class RingArgs(NamedTuple):
    """The three rings of one layer, as the decode kernel's keywords."""
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor

class RingCache(torch.nn.Module):
    def __init__(self, args, slots, dtype=torch.float32, device="cpu"):
        super().__init__()
        n, ring = args.n_layer, args.ring_len
        self.dtype = dtype
        self.register_buffer("att_kv", torch.zeros(n, slots, args.HV, args.V, args.K, dtype=torch.float32, device=device))
        self.register_buffer("d_ring", torch.zeros(n, slots, args.HV, ring, args.V, dtype=dtype, device=device))
        self.register_buffer("k_ring", torch.zeros(n, slots, args.H, ring, args.K, dtype=dtype, device=device))
        self.register_buffer("time_decay_ring", torch.zeros(n, slots, args.HV, ring, args.K, device=device))  # expect-bug: default-dtype id=export-dd
        self.register_buffer("write_pos", torch.zeros(n, slots, dtype=torch.int32, device=device))
    def layer(self, i):
        return RingArgs(d_cache=self.d_ring[i], k_cache=self.k_ring[i], g_cache=self.time_decay_ring[i])
    def snapshot(self, slot):
        """Host copy of one slot (to park a finished chat); rings in the cache's storage dtype."""
        snap = {"att_kv": self.att_kv[:, slot].cpu().clone(), "write_pos": self.write_pos[:, slot].cpu().clone()}
        for name in ("d_ring", "k_ring", "time_decay_ring"):
            snap[name] = getattr(self, name)[:, slot].cpu().clone().type(self.dtype)  # expect-bug: cast
        return snap
    def restore(self, slot, snap):
        for name, tensor in snap.items():
            getattr(self, name)[:, slot].copy_(tensor)
    def to_wire(self):
        """Every buffer's raw bytes, concatenated, for handing the cache to another process."""
        return torch.cat([buf.reshape(-1).view(torch.uint8) for _, buf in self.named_buffers()])
    def load_wire(self, blob):
        offset = 0
        for _, buf in self.named_buffers():
            size = buf.numel() * buf.element_size()
            buf.copy_(blob[offset:offset + size].view(buf.dtype).view(buf.shape))
            offset += size
        return self

class PinnedRingCache(RingCache):
    FP32_BUFFERS = ("att_kv", "time_decay_ring")
    def _apply(self, fn, recurse=True):
        kept = {name: getattr(self, name) for name in self.FP32_BUFFERS}
        super()._apply(fn, recurse)
        for name, old in kept.items():
            setattr(self, name, old.to(getattr(self, name).device))
        self.dtype = self.d_ring.dtype
        return self

def _args():
    return types.SimpleNamespace(n_layer=2, H=1, HV=2, K=4, V=4, ring_len=3)

def build_pinned_cache_half():
    """A pinned cache cast to fp16: d/k rings fp16, checkpoint and log-decay ring float32."""
    cache = PinnedRingCache(_args(), 2)
    cache.time_decay_ring.uniform_(-1.0, 0.0)
    return cache.half().to("cpu")

def build_cache_wire_roundtrip():
    src = RingCache(_args(), 3, dtype=torch.bfloat16)
    src.time_decay_ring.normal_(), src.d_ring.normal_(), src.write_pos.fill_(2)
    blob = src.to_wire()
    return {"wire": blob, "cache": RingCache(_args(), 3, dtype=torch.bfloat16).load_wire(blob)}

def build_cache_snapshot():
    cache = RingCache(_args(), 2, dtype=torch.bfloat16)
    cache.time_decay_ring.uniform_(-2.0, 0.0)
    snap, other = cache.snapshot(1), RingCache(_args(), 2, dtype=torch.bfloat16)
    other.restore(0, snap)
    return {"snapshot": snap, "cache": other}
