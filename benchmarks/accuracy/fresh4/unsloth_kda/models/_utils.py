# Copyright 2023-present Daniel Han-Chen & the Unsloth team. All rights reserved.
# Licensed under the Apache License, Version 2.0 (the "License").

__version__ = "2025.3.17"

import os
import torch
import logging
import contextlib
from ..kernels import ReplayRings

logger = logging.getLogger(__name__)

# =============================================
# Check bfloat16 support
if torch.cuda.is_available():
    major_version, minor_version = torch.cuda.get_device_capability()
    SUPPORTS_BFLOAT16 = (major_version >= 8)
else:
    # CPU path - bfloat16 is emulated, but every op we call supports it
    SUPPORTS_BFLOAT16 = True
pass

def is_bfloat16_supported():
    return SUPPORTS_BFLOAT16
pass

# Grow the serving slots in chunks, like KV_CACHE_INCREMENT for paged attention
REPLAY_CACHE_INCREMENT = 2

__DTYPE_MAP = {
    "float32": torch.float32, torch.float32: torch.float32,
    "float16": torch.float16, torch.float16: torch.float16,
    "bfloat16": torch.bfloat16, torch.bfloat16: torch.bfloat16,
}
def _get_dtype(dtype):
    try:
        return __DTYPE_MAP[dtype]
    except:
        if type(dtype) is str:
            try: dtype = eval(f"torch.{dtype.lower()}")
            except: pass
        if type(dtype) is torch.dtype: return dtype
    return None
pass

# Buffers the ReplaySSM kernel accumulates into. The decay ring holds log(alpha) per step,
# the kernel takes prefix sums and exp() - 16bit loses far too much, so always float32.
FLOAT32_CACHE_BUFFERS = frozenset(("recurrent_state", "state", "decay_cache", "g_cache",))

def get_cache_dtype(name, dtype):
    if name in FLOAT32_CACHE_BUFFERS: return torch.float32
    return _get_dtype(dtype)
pass

@contextlib.contextmanager
def patch_default_dtype(dtype):
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(_get_dtype(dtype))
    try:
        yield
    finally:
        torch.set_default_dtype(old_dtype)
pass

class UnslothReplayCache:
    """
    Serving slots for one Kimi Delta Attention layer: the checkpoint state
    S[slot, HV, V, K] plus the delta / key / decay rings of each slot.
    """
    def __init__(self, n_slots, n_heads, n_v_heads, replay_len, head_k_dim, head_v_dim,
        dtype = torch.bfloat16, gate_dtype = None, device = "cpu"):
        if gate_dtype is None: gate_dtype = get_cache_dtype("g_cache", dtype)
        self.dtype, self.device, self.n_slots = _get_dtype(dtype), device, n_slots
        self.state       = torch.zeros((n_slots, n_v_heads, head_v_dim, head_k_dim), dtype = get_cache_dtype("state", dtype), device = device)
        self.delta_cache = torch.zeros((n_slots, n_v_heads, replay_len, head_v_dim), dtype = get_cache_dtype("delta_cache", dtype), device = device)
        self.key_cache   = torch.zeros((n_slots, n_heads,   replay_len, head_k_dim), dtype = get_cache_dtype("key_cache", dtype), device = device)
        self.g_cache     = torch.zeros((n_slots, n_v_heads, replay_len, head_k_dim), dtype = gate_dtype, device = device)
        self.write_pos   = torch.zeros(n_slots, dtype = torch.int32, device = device)

    @classmethod
    def from_config(cls, config, n_slots = None, device = "cpu"):
        gate_dtype = config.replay_gate_dtype # expect-bug: imported-policy id=config-gate
        return cls(
            n_slots or config.max_batch_size, config.num_attention_heads, config.num_value_heads, config.replay_length,
            config.head_dim, config.value_head_dim, dtype = config.replay_cache_dtype, gate_dtype = gate_dtype, device = device,
        )

    def as_rings(self):
        return ReplayRings(self.delta_cache, self.key_cache, self.g_cache)

    def extend(self, n_slots = REPLAY_CACHE_INCREMENT):
        # torch.cat promotes the 16bit padding into float32 for the state and decay ring
        pad = lambda x: torch.zeros((n_slots, *x.shape[1:]), dtype = self.dtype, device = self.device)
        self.state       = torch.cat([self.state,       pad(self.state)])
        self.delta_cache = torch.cat([self.delta_cache, pad(self.delta_cache)])
        self.key_cache   = torch.cat([self.key_cache,   pad(self.key_cache)])
        self.g_cache     = torch.cat([self.g_cache,     pad(self.g_cache)])
        self.write_pos   = torch.cat([self.write_pos,   self.write_pos.new_zeros(n_slots)])
        self.n_slots += n_slots
        return self

    def resize(self, n_slots):
        keep = min(n_slots, self.n_slots)
        with patch_default_dtype(self.dtype): # expect-bug: default-dtype id=resize-default
            delta_cache = torch.zeros((n_slots, *self.delta_cache.shape[1:]), device = self.device)
            key_cache   = torch.zeros((n_slots, *self.key_cache.shape[1:]),   device = self.device)
            g_cache     = torch.zeros((n_slots, *self.g_cache.shape[1:]),     device = self.device) # expect-bug: default-dtype id=resize-default
        state = torch.zeros((n_slots, *self.state.shape[1:]), dtype = torch.float32, device = self.device)
        for new, old in ((state, self.state), (delta_cache, self.delta_cache), (key_cache, self.key_cache), (g_cache, self.g_cache)):
            new[:keep] = old[:keep]
        self.state, self.delta_cache, self.key_cache, self.g_cache = state, delta_cache, key_cache, g_cache
        self.write_pos = torch.cat([self.write_pos[:keep], torch.zeros(n_slots - keep, dtype = torch.int32, device = self.device)])
        self.n_slots = n_slots
        return self

    def to(self, device, non_blocking = False):
        self.state       = self.state      .to(device, non_blocking = non_blocking)
        self.delta_cache = self.delta_cache.to(device = device, dtype = self.dtype, non_blocking = non_blocking)
        self.key_cache   = self.key_cache  .to(device = device, dtype = self.dtype, non_blocking = non_blocking)
        self.g_cache     = self.g_cache    .to(device = device, dtype = self.dtype, non_blocking = non_blocking) # expect-bug: cast
        self.write_pos   = self.write_pos  .to(device, non_blocking = non_blocking)
        self.device = device
        return self

    def fork_slot(self, slot, n):
        """Copies of one slot's rings for n beams."""
        delta_cache = self.delta_cache[slot : slot+1].repeat(n, 1, 1, 1)
        key_cache   = self.key_cache  [slot : slot+1].repeat(n, 1, 1, 1)
        decay_cache = torch.empty_like(delta_cache) # expect-bug: like
        decay_cache[:] = self.g_cache[slot]
        return ReplayRings(delta_cache, key_cache, decay_cache)

    def state_dict(self):
        return {"state" : self.state, "delta_cache" : self.delta_cache, "key_cache" : self.key_cache, "g_cache" : self.g_cache, "write_pos" : self.write_pos}

    def load_state_dict(self, state_dict):
        # copy_ keeps our dtypes, whatever the checkpoint was saved in
        for name, tensor in self.state_dict().items():
            tensor.copy_(state_dict[name])

    def swap_out(self, slot, path):
        torch.save({name : x[slot].clone() for name, x in self.state_dict().items()}, path)

    def swap_in(self, slot, path):
        saved = torch.load(path, map_location = self.device, weights_only = True)
        for name, x in self.state_dict().items():
            x[slot] = saved[name]

    def load_state(self, path):
        # Full restore of an offloaded cache (after a server restart)
        saved = torch.load(path, map_location = self.device, weights_only = True)
        self.state       = saved["state"].float()
        self.delta_cache = saved["delta_cache"].to(self.dtype)
        self.key_cache   = saved["key_cache"]  .to(self.dtype)
        self.g_cache     = saved["g_cache"] # expect-bug: load id=legacy-offload
        self.write_pos   = saved["write_pos"].int()
        self.n_slots     = self.state.shape[0]
        return self
pass

def build_replay_cache(tmp_dir):
    cache = UnslothReplayCache(3, 2, 2, 4, 8, 8, dtype = torch.bfloat16)
    cache.g_cache.uniform_(-1, 0)
    cache.delta_cache.normal_()
    cache.swap_out(1, os.path.join(tmp_dir, "slot1.pt"))
    cache.swap_in(2, os.path.join(tmp_dir, "slot1.pt"))
    backup = {k : v.float() for k, v in cache.state_dict().items()}
    restored = UnslothReplayCache(3, 2, 2, 4, 8, 8, dtype = torch.bfloat16)
    restored.load_state_dict(backup)
    return {"cache" : cache.extend(), "restored" : restored}
pass

def build_cache_maintenance(tmp_dir):
    cache = UnslothReplayCache(2, 2, 2, 4, 8, 8, dtype = torch.float16)
    cache.g_cache.uniform_(-1, 0)
    beams = cache.fork_slot(0, 3)
    resized = UnslothReplayCache(2, 2, 2, 4, 8, 8, dtype = torch.bfloat16).resize(4)
    moved = UnslothReplayCache(2, 2, 2, 4, 8, 8, dtype = torch.bfloat16).to("cpu")
    # Offload files written before 2025.3 kept every ring in the model dtype
    legacy = {k : (v.half() if v.is_floating_point() else v) for k, v in cache.state_dict().items()} # expect-bug: load id=legacy-offload
    torch.save(legacy, os.path.join(tmp_dir, "offload.pt"))
    restored = UnslothReplayCache(2, 2, 2, 4, 8, 8, dtype = torch.float16)
    restored.load_state(os.path.join(tmp_dir, "offload.pt"))
    return {"beams" : beams, "resized" : resized, "moved" : moved, "restored" : restored}
pass
