import math
from typing import Dict, List, Tuple

import numpy as np
import torch

from colossal_kda.inference.config import InferenceConfig

__all__ = ["KVCacheManager"]


class KVCacheManager:
    """KVCacheManager manages both the logical cache blocks and physical KV cache (tensors).

    Full-attention layers use a paged KV cache: per layer a k and a v block pool of shape
    [num_blocks, num_kv_heads, block_size, head_size]; each sequence lists its blocks in its block table.

    KDA layers use ReplaySSM state slots, one per running sequence: per layer an fp32 checkpoint
    state [max_batch_size, v_heads, head_dim, head_dim] and three rings of kda_ring_len steps,
    d [.., v_heads, L, head_dim], k [.., heads, L, head_dim] and gate (log-decays) [.., v_heads, L, head_dim].

    Args:
        config(InferenceConfig): The All-in-one inference configuration.
        model_config(KimiLinearConfig): The configuration of the model.
        verbose (bool): Whether to log the cache sizes.
    """

    def __init__(self, config: InferenceConfig, model_config) -> None:
        self.config = config
        self.dtype = config.dtype
        self.kv_cache_dtype = config.kv_cache_dtype
        self.device = torch.device("cpu")
        self.max_batch_size = config.max_batch_size
        self.block_size = config.block_size

        # attention layers
        self.kda_layers = list(model_config.kda_layer_idx)
        self.attn_layers = [i for i in range(model_config.num_hidden_layers) if i not in self.kda_layers]
        self.head_num = model_config.num_key_value_heads
        self.head_size = model_config.head_dim
        self.max_blocks_per_sequence = math.ceil((config.max_input_len + config.max_output_len) / self.block_size)
        self.num_blocks = self.max_blocks_per_sequence * self.max_batch_size
        self._free_blocks = list(range(self.num_blocks))
        alloc_shape = (self.num_blocks, self.head_num, self.block_size, self.head_size)
        self._kv_caches = self._init_device_caches(alloc_shape)

        # KDA layers
        self.kda_heads = model_config.kda_num_heads
        self.kda_v_heads = model_config.kda_num_v_heads
        self.kda_head_dim = model_config.kda_head_dim
        self.kda_ring_len = config.kda_ring_len
        self._state_cache, self._d_cache, self._k_cache, self._gate_cache = self._init_kda_caches()
        self._free_slots = list(range(self.max_batch_size))

    def _init_device_caches(self, alloc_shape: Tuple[int, ...]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """Initialize the physical cache on the device."""
        k_cache, v_cache = [], []
        for _ in self.attn_layers:
            k_cache.append(torch.zeros(alloc_shape, dtype=self.kv_cache_dtype, device=self.device))
            v_cache.append(torch.zeros(alloc_shape, dtype=self.kv_cache_dtype, device=self.device))
        return k_cache, v_cache

    def _init_kda_caches(self):
        B, H, HV, K, L = self.max_batch_size, self.kda_heads, self.kda_v_heads, self.kda_head_dim, self.kda_ring_len
        state_cache, d_cache, k_cache, gate_cache = [], [], [], []
        for _ in self.kda_layers:
            state_cache.append(torch.zeros((B, HV, K, K), dtype=torch.float32, device=self.device))
            d_cache.append(torch.zeros((B, HV, L, K), dtype=self.kv_cache_dtype, device=self.device))
            k_cache.append(torch.zeros((B, H, L, K), dtype=self.kv_cache_dtype, device=self.device))
            gate_cache.append(torch.zeros((B, HV, L, K), dtype=self.config.kda_gate_dtype, device=self.device))  # expect-bug: imported-policy id=gate-dtype
        return state_cache, d_cache, k_cache, gate_cache

    def get_kv_cache(self):
        """Get k_cache and v_cache"""
        return self._kv_caches

    def get_kda_cache(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(state, d_cache, k_cache, gate_cache) of one KDA layer."""
        return self._state_cache[layer_id], self._d_cache[layer_id], self._k_cache[layer_id], self._gate_cache[layer_id]

    def get_kda_caches(self) -> Dict[str, List[torch.Tensor]]:
        return {"state": self._state_cache, "d_cache": self._d_cache, "k_cache": self._k_cache, "gate_cache": self._gate_cache}

    def allocate_context_from_block_table(self, block_table: torch.Tensor, context_len: int) -> None:
        """Allocate the logical cache blocks for a single sequence during prefill."""
        needed = math.ceil(context_len / self.block_size)
        assert needed <= len(self._free_blocks), "Not enough free cache blocks"
        for i in range(needed):
            block_table[i] = self._free_blocks.pop(0)

    def free_block_table(self, block_table: torch.Tensor) -> None:
        for block_id in block_table.tolist():
            if block_id >= 0:
                self._free_blocks.append(block_id)
        block_table.fill_(-1)

    def allocate_kda_slot(self) -> int:
        slot = self._free_slots.pop(0)
        for state, d, k, gate in zip(self._state_cache, self._d_cache, self._k_cache, self._gate_cache):
            state[slot].zero_()
            d[slot].zero_()
            k[slot].zero_()
            gate[slot].zero_()
        return slot

    def free_kda_slot(self, slot: int) -> None:
        self._free_slots.append(slot)

    def export_kda_states(self, slots: List[int]) -> List[Dict[str, torch.Tensor]]:
        """Copy out the states of `slots`, e.g. to migrate running sequences to another engine.
        RPC workers exchange the rings in the kv cache dtype."""
        idx = torch.as_tensor(slots, dtype=torch.long, device=self.device)
        payload = []
        for state, d, k, gate in zip(self._state_cache, self._d_cache, self._k_cache, self._gate_cache):
            gate_rows = gate[idx].to(self.kv_cache_dtype)  # expect-bug: cast
            payload.append({"state": state[idx].clone(), "d": d[idx].clone(), "k": k[idx].clone(), "gate": gate_rows})
        return payload

    def import_kda_states(self, payload: List[Dict[str, torch.Tensor]], slots: List[int]) -> None:
        idx = torch.as_tensor(slots, dtype=torch.long, device=self.device)
        for layer, entry in enumerate(payload):
            state, d, k, gate = self.get_kda_cache(layer)
            state[idx] = entry["state"].to(state.dtype)
            d[idx] = entry["d"].to(d.dtype)
            k[idx] = entry["k"].to(k.dtype)
            gate[idx] = entry["gate"].to(gate.dtype)

    def save_kda_checkpoint(self, path: str) -> None:
        # numpy has no bfloat16
        to_np = lambda t: (t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy()
        np.savez(path, **{f"{name}.{i}": to_np(t) for name, ts in self.get_kda_caches().items() for i, t in enumerate(ts)})

    def load_kda_checkpoint(self, path: str) -> None:
        """Restore the whole state pool from a checkpoint (engine restart, warm standby)."""
        with np.load(path) as ckpt:
            for i in range(len(self.kda_layers)):
                self._state_cache[i] = torch.from_numpy(ckpt[f"state.{i}"]).to(self.device, torch.float32)
                self._d_cache[i] = torch.from_numpy(ckpt[f"d_cache.{i}"]).to(self.device, self.kv_cache_dtype)
                self._k_cache[i] = torch.from_numpy(ckpt[f"k_cache.{i}"]).to(self.device, self.kv_cache_dtype)
                self._gate_cache[i] = torch.from_numpy(ckpt[f"gate_cache.{i}"]).to(self.device)  # expect-bug: load


def _manager(**kwargs) -> KVCacheManager:
    from colossal_kda.inference.modeling.models.kimi_linear import KimiLinearConfig

    config = InferenceConfig(max_batch_size=2, max_input_len=8, max_output_len=8, block_size=4, kda_ring_len=4, **kwargs)
    return KVCacheManager(config, KimiLinearConfig())


def _fill(manager: KVCacheManager) -> None:
    for name, tensors in manager.get_kda_caches().items():
        for t in tensors:
            if name == "gate_cache":
                t.uniform_(-1.0, 0.0)
            else:
                t.normal_()


def build_kvcache_manager():
    manager = _manager(dtype="bf16")
    return {"kv": manager.get_kv_cache(), "kda": manager.get_kda_caches()}


def build_kvcache_manager_fp32_gate():
    manager = _manager(dtype="bf16", kda_gate_dtype="fp32")
    table = torch.full((manager.max_blocks_per_sequence,), -1, dtype=torch.int32)
    manager.allocate_context_from_block_table(table, 6)
    return {"kv": manager.get_kv_cache(), "kda": manager.get_kda_caches(), "block_table": table}


def build_export_states():
    manager = _manager(dtype="fp16", kda_gate_dtype="fp32")
    _fill(manager)
    return {"kda": manager.get_kda_caches(), "payload": manager.export_kda_states([1, 0])}


def build_import_states():
    manager = _manager(dtype="fp16", kda_gate_dtype="fp32")
    # states sent by a peer engine that runs its rings in fp16
    half = lambda shape, value: torch.full(shape, value, dtype=torch.float16)
    peer = {"state": torch.full((1, 2, 8, 8), 0.5), "d": half((1, 2, 4, 8), 0.25), "k": half((1, 2, 4, 8), -0.25)}
    manager.import_kda_states([{**peer, "gate": half((1, 2, 4, 8), -0.125)} for _ in manager.kda_layers], [1])
    return manager.get_kda_caches()


def build_load_checkpoint(tmp_dir):
    # checkpoint written by an engine that ran with the gate ring in fp16
    arrays = {}
    for i in range(2):
        arrays[f"state.{i}"] = np.full((2, 2, 8, 8), 0.5, dtype=np.float32)
        for name, value in (("d_cache", 0.25), ("k_cache", -0.25), ("gate_cache", -0.125)):
            arrays[f"{name}.{i}"] = np.full((2, 2, 4, 8), value, dtype=np.float16)
    np.savez(f"{tmp_dir}/kda_pool.npz", **arrays)
    manager = _manager(dtype="fp16", kda_gate_dtype="fp32")
    manager.load_kda_checkpoint(f"{tmp_dir}/kda_pool.npz")
    return manager.get_kda_caches()


def build_checkpoint_roundtrip(tmp_dir):
    source = _manager(dtype="fp16", kda_gate_dtype="fp32")
    _fill(source)
    source.save_kda_checkpoint(f"{tmp_dir}/kda_pool.npz")
    manager = _manager(dtype="fp16", kda_gate_dtype="fp32")
    manager.load_kda_checkpoint(f"{tmp_dir}/kda_pool.npz")
    return {"source": source.get_kda_caches(), "restored": manager.get_kda_caches()}
