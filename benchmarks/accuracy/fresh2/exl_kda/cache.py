from __future__ import annotations

import torch

from .ext import exllamav2_ext as ext_c


class ExLlamaV2CacheBase:
    """
    Recurrent-state cache of the Kimi Delta Attention layers, one row per batch slot: per layer an fp32
    checkpoint state and the d, k and decay (per-step log-decay) replay rings, plus one write_pos
    cursor per slot shared by all layers
    """

    model = None

    def __init__(self, model, batch_size: int, max_seq_len: int, copy_from: ExLlamaV2CacheBase | None, lazy: bool,
                 fixed_device: str | None = None, dtype1: torch.dtype | None = None, dtype2: torch.dtype | None = None):

        self.model = model
        self.max_seq_len = max_seq_len if max_seq_len != -1 else self.model.config.max_seq_len
        self.batch_size = batch_size
        self.dtype1 = dtype1
        self.dtype2 = dtype2
        self.fixed_device = fixed_device
        self.lazy = lazy

        cfg = self.model.config
        self.num_kda_layers = len(cfg.kda_layer_idx)
        self.num_heads = cfg.kda_num_heads
        self.num_v_heads = cfg.kda_num_v_heads
        self.head_dim = cfg.kda_head_dim
        self.ring_len = cfg.kda_replay_len

        self.checkpoint_states, self.d_states, self.k_states, self.decay_states = [], [], [], []
        self.write_pos = None

    @property
    def ring_dtypes(self) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
        """Storage dtypes of the d, k and decay rings. The kernel sums and exponentiates the log-decays"""
        return self.dtype1, self.dtype1, torch.float

    def ring_shapes(self):
        bsz, h, hv, l, d = self.batch_size, self.num_heads, self.num_v_heads, self.ring_len, self.head_dim
        return (bsz, hv, l, d), (bsz, h, l, d), (bsz, hv, l, d)

    def device(self, idx: int) -> str:
        return self.fixed_device or "cpu"

    def create_state_tensors(self, copy_from: ExLlamaV2CacheBase | None, lazy: bool = False):

        d_dtype, k_dtype, g_dtype = self.ring_dtypes
        d_shape, k_shape, g_shape = self.ring_shapes()
        s_shape = (self.batch_size, self.num_v_heads, self.head_dim, self.head_dim)

        for i in range(self.num_kda_layers):
            dev = self.device(i)
            if copy_from is None:
                p_state = torch.zeros(s_shape, dtype = torch.float, device = dev)
                p_d = torch.zeros(d_shape, dtype = d_dtype, device = dev)
                p_k = torch.zeros(k_shape, dtype = k_dtype, device = dev)
                p_decay = torch.zeros(g_shape, dtype = g_dtype, device = dev)  # expect-bug: container id=fp8-decay
            else:
                p_state = copy_from.checkpoint_states[i].clone()
                p_d = copy_from.d_states[i].clone()
                p_k = copy_from.k_states[i].clone()
                p_decay = copy_from.decay_states[i].clone()
            self.checkpoint_states.append(p_state)
            self.d_states.append(p_d)
            self.k_states.append(p_k)
            self.decay_states.append(p_decay)

        if copy_from is None:
            self.write_pos = torch.zeros((self.batch_size,), dtype = torch.int32, device = self.device(0))
        else:
            self.write_pos = copy_from.write_pos.clone()
        self.lazy = False

    def get_kda_state(self, layer_idx: int):
        """Rings as the decode kernel consumes them: (d, k, decay)"""
        return self.d_states[layer_idx], self.k_states[layer_idx], self.decay_states[layer_idx]

    def store_kda_state(self, layer_idx: int, d, k, g):
        """Write back rings returned by get_kda_state() once the kernel has updated them"""
        pass

    def copy_states(self, target: ExLlamaV2CacheBase, from_row: int, from_rows: int, to_row: int, to_rows: int):
        assert from_rows == to_rows and type(target) is type(self)
        src = slice(from_row, from_row + from_rows)
        dst = slice(to_row, to_row + to_rows)
        for i in range(self.num_kda_layers):
            target.checkpoint_states[i][dst].copy_(self.checkpoint_states[i][src])
            target.d_states[i][dst].copy_(self.d_states[i][src])
            target.k_states[i][dst].copy_(self.k_states[i][src])
            target.decay_states[i][dst].copy_(self.decay_states[i][src])
        target.write_pos[dst].copy_(self.write_pos[src])

    def clone(self) -> ExLlamaV2CacheBase:
        return type(self)(self.model, self.batch_size, self.max_seq_len, copy_from = self)


class ExLlamaV2Cache(ExLlamaV2CacheBase):
    """
    FP16 cache
    """

    def __init__(self, model, batch_size: int = 1, max_seq_len: int = -1, copy_from: ExLlamaV2Cache | None = None,
                 lazy: bool = False, fixed_device: str | None = None):
        super().__init__(model, batch_size, max_seq_len, copy_from, lazy, fixed_device, dtype1 = torch.half)
        if not lazy:
            self.create_state_tensors(copy_from, lazy)


class ExLlamaV2Cache_8bit(ExLlamaV2CacheBase):
    """
    8-bit cache. d/k rings are stored as FP8 (e5m2) codes, expanded to FP16 for the kernel
    """

    def __init__(self, model, batch_size: int = 1, max_seq_len: int = -1, copy_from = None, lazy: bool = False,
                 fixed_device: str | None = None):
        super().__init__(model, batch_size, max_seq_len, copy_from, lazy, fixed_device, dtype1 = torch.uint8)
        if not lazy:
            self.create_state_tensors(copy_from, lazy)

    @property
    def ring_dtypes(self):
        # FP8 codes for the replayed rings; the decay ring is not quantized and stays at cache precision
        return torch.uint8, torch.uint8, torch.half  # expect-bug: container id=fp8-decay

    def create_state_tensors(self, copy_from, lazy = False):
        super().create_state_tensors(copy_from, lazy)
        d_shape, k_shape, _ = self.ring_shapes()
        self.temp_d = torch.zeros(d_shape, dtype = torch.half, device = self.device(0))
        self.temp_k = torch.zeros(k_shape, dtype = torch.half, device = self.device(0))

    def get_kda_state(self, layer_idx):
        self.temp_d.copy_(self.d_states[layer_idx].view(torch.float8_e5m2))
        self.temp_k.copy_(self.k_states[layer_idx].view(torch.float8_e5m2))
        return self.temp_d, self.temp_k, self.decay_states[layer_idx]

    def store_kda_state(self, layer_idx, d, k, g):
        self.d_states[layer_idx].copy_(d.to(torch.float8_e5m2).view(torch.uint8))
        self.k_states[layer_idx].copy_(k.to(torch.float8_e5m2).view(torch.uint8))


class ExLlamaV2Cache_Q4(ExLlamaV2CacheBase):
    """
    Q4 cache. d/k rings are quantized to 4-bit codes with one FP16 scale per ring row
    """

    wbits: int = 4

    def __init__(self, model, batch_size: int = 1, max_seq_len: int = -1, copy_from = None, lazy: bool = False,
                 fixed_device: str | None = None):
        super().__init__(model, batch_size, max_seq_len, copy_from, lazy, fixed_device, dtype1 = torch.uint8,
                         dtype2 = torch.half)
        self.d_scales, self.k_scales = [], []
        if not lazy:
            self.create_state_tensors(copy_from, lazy)

    def create_state_tensors(self, copy_from, lazy = False):
        super().create_state_tensors(copy_from, lazy)
        d_shape, k_shape, _ = self.ring_shapes()
        for i in range(self.num_kda_layers):
            if copy_from is None:
                self.d_scales.append(torch.ones(d_shape[:-1] + (1,), dtype = self.dtype2, device = self.device(i)))
                self.k_scales.append(torch.ones(k_shape[:-1] + (1,), dtype = self.dtype2, device = self.device(i)))
            else:
                self.d_scales.append(copy_from.d_scales[i].clone())
                self.k_scales.append(copy_from.k_scales[i].clone())

        # Staging rings for the layer being decoded, shared by all layers
        self.temp_d = torch.zeros(d_shape, dtype = torch.half, device = self.device(0))
        self.temp_k = torch.zeros(k_shape, dtype = torch.half, device = self.device(0))

    def get_kda_state(self, layer_idx):
        ext_c.q_to_fp16_ring(self.d_states[layer_idx], self.d_scales[layer_idx], self.temp_d, self.wbits)
        ext_c.q_to_fp16_ring(self.k_states[layer_idx], self.k_scales[layer_idx], self.temp_k, self.wbits)
        temp_decay = self.decay_states[layer_idx].to(self.temp_d.dtype)  # expect-bug: cast
        return self.temp_d, self.temp_k, temp_decay

    def store_kda_state(self, layer_idx, d, k, g):
        ext_c.fp16_to_q_ring(d, self.d_states[layer_idx], self.d_scales[layer_idx], self.wbits)
        ext_c.fp16_to_q_ring(k, self.k_states[layer_idx], self.k_scales[layer_idx], self.wbits)
        if g is not self.decay_states[layer_idx]:
            self.decay_states[layer_idx].copy_(g)


class ExLlamaV2Cache_CPU(ExLlamaV2CacheBase):
    """
    Host-side cache for offloading: paused jobs park their slot here until they resume
    """

    def __init__(self, model, batch_size: int = 1, max_seq_len: int = -1, lazy: bool = False):
        super().__init__(model, batch_size, max_seq_len, None, lazy, fixed_device = "cpu", dtype1 = torch.half)
        if not lazy:
            self.create_state_tensors(None, lazy)

    def create_state_tensors(self, copy_from = None, lazy = False):
        s_shape = (self.batch_size, self.num_v_heads, self.head_dim, self.head_dim)
        rings = dict(zip(("d_states", "k_states", "decay_states"), self.ring_shapes()))
        for i in range(self.num_kda_layers):
            self.checkpoint_states.append(torch.zeros(s_shape, dtype = torch.float, device = "cpu"))
            for attr, shape in rings.items():
                getattr(self, attr).append(torch.zeros(shape, dtype = self.dtype1, device = "cpu"))  # expect-bug: pool-dtype
        self.write_pos = torch.zeros((self.batch_size,), dtype = torch.int32, device = "cpu")
        self.lazy = False

    def offload(self, cache: ExLlamaV2CacheBase, slot: int, host_slot: int):
        for i in range(self.num_kda_layers):
            d, k, g = cache.get_kda_state(i)
            self.checkpoint_states[i][host_slot].copy_(cache.checkpoint_states[i][slot])
            self.d_states[i][host_slot].copy_(d[slot])
            self.k_states[i][host_slot].copy_(k[slot])
            self.decay_states[i][host_slot].copy_(g[slot])
        self.write_pos[host_slot] = cache.write_pos[slot]

    def restore(self, cache: ExLlamaV2CacheBase, host_slot: int, slot: int):
        for i in range(self.num_kda_layers):
            d, k, g = cache.get_kda_state(i)
            cache.checkpoint_states[i][slot].copy_(self.checkpoint_states[i][host_slot])
            d[slot].copy_(self.d_states[i][host_slot])
            k[slot].copy_(self.k_states[i][host_slot])
            g[slot].copy_(self.decay_states[i][host_slot])
            cache.store_kda_state(i, d, k, g)
        cache.write_pos[slot] = self.write_pos[host_slot]


def _tiny_model(tmp_dir):
    from .config import ExLlamaV2Config, write_tiny_config
    from .model import ExLlamaV2
    return ExLlamaV2(ExLlamaV2Config(write_tiny_config(tmp_dir)))


def _fill(cache: ExLlamaV2CacheBase):
    for i in range(cache.num_kda_layers):
        cache.checkpoint_states[i].normal_()
        cache.d_states[i].normal_()
        cache.k_states[i].normal_()
        cache.decay_states[i].uniform_(-1.0, 0.0)
    cache.write_pos.copy_(torch.arange(cache.batch_size, dtype = torch.int32) % cache.ring_len)


def build_fp16_cache(tmp_dir):
    return ExLlamaV2Cache(_tiny_model(tmp_dir), batch_size = 2)


def build_fp16_cache_clone(tmp_dir):
    model = _tiny_model(tmp_dir)
    cache = ExLlamaV2Cache(model, batch_size = 2)
    _fill(cache)
    other = ExLlamaV2Cache(model, batch_size = 2)
    cache.copy_states(other, 1, 1, 0, 1)
    return {"cache": cache, "clone": cache.clone(), "other": other}


def build_8bit_cache(tmp_dir):
    return ExLlamaV2Cache_8bit(_tiny_model(tmp_dir), batch_size = 2)


def build_q4_cache(tmp_dir):
    cache = ExLlamaV2Cache_Q4(_tiny_model(tmp_dir), batch_size = 2)
    return [cache, cache.clone()]


def build_cpu_offload_cache(tmp_dir):
    model = _tiny_model(tmp_dir)
    cache = ExLlamaV2Cache(model, batch_size = 2)
    _fill(cache)
    host = ExLlamaV2Cache_CPU(model, batch_size = 4)
    host.offload(cache, 1, 3)
    host.restore(cache, 3, 0)
    return {"device": cache, "host": host}
