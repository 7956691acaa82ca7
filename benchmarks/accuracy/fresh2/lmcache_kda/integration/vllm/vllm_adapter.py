"""Connects a vLLM-style model runner to the LMCache engine for the ReplaySSM state of KDA layers."""

import dataclasses
from typing import NamedTuple

import torch

from ... import c_ops
from ...cache_engine import LMCacheEngine, LMCacheEngineBuilder
from ...config import LMCacheEngineConfig, LMCacheEngineMetadata
from ...utils import ReplayStateChunk, get_kv_cache_torch_dtype


class KDALayerCache(NamedTuple):
    """What the model runner's cache manager hands one KDA layer (its `kv_caches[layer_idx]` entry)."""

    ssm_state: torch.Tensor  # [slots, HV, V, K] float32
    d_cache: torch.Tensor  # [slots, HV, L, V] kv_dtype
    k_cache: torch.Tensor  # [slots, H, L, K] kv_dtype
    g_cache: torch.Tensor  # [slots, HV, L, K] float32
    write_pos: torch.Tensor  # [slots] int32


def allocate_kda_kv_caches(metadata: LMCacheEngineMetadata, num_slots: int, device="cpu") -> list[KDALayerCache]:
    n, H, HV, L, K, V = metadata.kv_shape
    kv, fp32 = dict(dtype=metadata.kv_dtype, device=device), dict(dtype=torch.float32, device=device)
    return [
        KDALayerCache(
            ssm_state=torch.zeros(num_slots, HV, V, K, **fp32),
            d_cache=torch.zeros(num_slots, HV, L, V, **kv),
            k_cache=torch.zeros(num_slots, H, L, K, **kv),
            g_cache=torch.zeros(num_slots, HV, L, K, **fp32),
            write_pos=torch.zeros(num_slots, dtype=torch.int32, device=device),
        )
        for _ in range(n)
    ]


def init_lmcache_engine(model_config: dict, parallel_config: dict, cache_config: dict, lmcache_config: dict, instance_id="vllm-instance") -> LMCacheEngine:
    """The LMCache engine of a vLLM worker, created once from the vLLM configs and the LMCache yaml."""
    if (engine := LMCacheEngineBuilder.get(instance_id)) is not None:
        return engine
    la = model_config["linear_attn_config"]
    heads = la["num_heads"]
    metadata = LMCacheEngineMetadata(
        model_name=model_config["model"],
        world_size=parallel_config.get("world_size", 1),
        worker_id=parallel_config.get("rank", 0),
        fmt="vllm",
        kv_dtype=get_kv_cache_torch_dtype(cache_config.get("cache_dtype", "auto"), model_config["dtype"]),
        kv_shape=(len(la["kda_layers"]), heads, la.get("num_v_heads", heads), la["ring_len"], la["head_dim"], la["head_dim"]),
    )
    return LMCacheEngineBuilder.get_or_create(instance_id, LMCacheEngineConfig.from_dict(lmcache_config), metadata)


def _gather_slot(kv_caches: list[KDALayerCache], slot: int) -> ReplayStateChunk:
    stacked = [torch.stack([c[i][slot] for c in kv_caches]) for i in range(4)]
    return ReplayStateChunk(*stacked, write_pos=int(kv_caches[0].write_pos[slot]))


def _scatter_slot(chunk: ReplayStateChunk, kv_caches: list[KDALayerCache], slot: int) -> None:
    for layer, cache in enumerate(kv_caches):
        for dst, src in zip(cache[:4], chunk[:4]):
            dst[slot].copy_(src[layer])
        cache.write_pos[slot] = chunk.write_pos


@torch.no_grad()
def lmcache_store_replay_state(engine: LMCacheEngine, kv_caches: list[KDALayerCache], slot: int, token_ids: list[int]) -> bool:
    """Stores the state of `slot` after its request consumed `token_ids` (called on chunk boundaries)."""
    return engine.store(token_ids, _gather_slot(kv_caches, slot))


@torch.no_grad()
def lmcache_retrieve_replay_state(engine: LMCacheEngine, kv_caches: list[KDALayerCache], slot: int, token_ids: list[int]) -> int:
    """Restores the longest stored prefix state of `token_ids` into `slot`; returns the number of tokens it covers."""
    num_hit, chunk = engine.retrieve(token_ids)
    if chunk is not None:
        _scatter_slot(chunk, kv_caches, slot)
    return num_hit


def append_tail_rows(chunk: ReplayStateChunk, d_rows, k_rows, g_rows) -> ReplayStateChunk:
    """The chunk after the prompt tokens past the stored boundary, whose rows `[layers, heads, n, dim]` the prefill
    kernel computed in the activation dtype: they are appended to the rings, the oldest rows fall out."""
    n = g_rows.shape[2]
    return chunk._replace(
        d_ring=torch.cat([chunk.d_ring[:, :, n:], d_rows], dim=2),
        k_ring=torch.cat([chunk.k_ring[:, :, n:], k_rows], dim=2),
        log_gate_ring=torch.cat([chunk.log_gate_ring[:, :, n:], g_rows], dim=2),
        write_pos=min(chunk.write_pos + n, chunk.log_gate_ring.shape[2]),
    )


class ReplayPrefetchBuffer:
    """Landing zone for states retrieved ahead of scheduling, so that admitting the request later is one copy."""

    def __init__(self, metadata: LMCacheEngineMetadata, max_requests: int, device="cpu"):
        n, H, HV, L, K, V = metadata.kv_shape
        self.ssm_state = torch.zeros(max_requests, n, HV, V, K, dtype=torch.float32, device=device)
        self.d_ring = torch.zeros(max_requests, n, HV, L, V, dtype=metadata.kv_dtype, device=device)
        self.k_ring = torch.zeros(max_requests, n, H, L, K, dtype=metadata.kv_dtype, device=device)
        # same [requests, layers, heads, L, K] layout as the key ring
        self.log_gate_ring = torch.zeros_like(self.k_ring)  # expect-bug: like
        self.write_pos = torch.zeros(max_requests, dtype=torch.int32, device=device)

    def _row(self, idx: int) -> ReplayStateChunk:
        return ReplayStateChunk(self.ssm_state[idx], self.d_ring[idx], self.k_ring[idx], self.log_gate_ring[idx], 0)

    @torch.no_grad()
    def prefetch(self, idx: int, engine: LMCacheEngine, token_ids: list[int]) -> int:
        num_hit, chunk = engine.retrieve(token_ids)
        if chunk is not None:
            for dst, src in zip(self._row(idx)[:4], chunk[:4]):
                dst.copy_(src)
            self.write_pos[idx] = chunk.write_pos
        return num_hit

    def admit(self, idx: int, kv_caches: list[KDALayerCache], slot: int) -> None:
        _scatter_slot(self._row(idx)._replace(write_pos=int(self.write_pos[idx])), kv_caches, slot)


class ReplayLookaheadRunner:
    """Runs decode steps of one layer on a copy of a retrieved state (to score a speculative continuation, say)
    without touching the model runner's slots."""

    # kernel argument -> scratch buffer
    _KERNEL_ARGS = {"initial_state": "s", "d_cache": "v", "k_cache": "k", "g_cache": "w", "write_pos": "pos"}

    def __init__(self, metadata: LMCacheEngineMetadata, num_slots: int, device="cpu"):
        _, H, HV, L, K, V = metadata.kv_shape
        self.scale = K**-0.5
        self.scratch: dict[str, torch.Tensor] = {}
        self.scratch["s"] = torch.zeros(num_slots, HV, V, K, dtype=torch.float32, device=device)
        self.scratch["v"] = torch.zeros(num_slots, HV, L, V, dtype=metadata.kv_dtype, device=device)
        self.scratch["k"] = torch.zeros(num_slots, H, L, K, dtype=metadata.kv_dtype, device=device)
        self.scratch["w"] = torch.zeros(num_slots, HV, L, K, dtype=metadata.kv_dtype, device=device)  # expect-bug: decode-arg
        self.scratch["pos"] = torch.zeros(num_slots, dtype=torch.int32, device=device)

    @torch.no_grad()
    def load(self, slot: int, chunk: ReplayStateChunk, layer: int) -> None:
        for name, src in zip("svkw", chunk[:4]):
            self.scratch[name][slot].copy_(src[layer])
        self.scratch["pos"][slot] = chunk.write_pos

    def step(self, weights: dict, slot_ids, mixed_qkv, a, b):
        kwargs = {arg: self.scratch[name] for arg, name in self._KERNEL_ARGS.items()}
        out = mixed_qkv.new_zeros(mixed_qkv.shape[0], self.scratch["v"].shape[1], self.scratch["v"].shape[3])
        return c_ops.fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, weights["A_log"], weights["dt_bias"], self.scale, out=out, ssm_state_indices=slot_ids,
            use_qk_l2norm_in_kernel=True, **kwargs,
        )


class ReplayDecodeSaver:
    """`save_decode_cache`: stores the state of a running slot every `chunk_size` generated tokens."""

    def __init__(self, engine: LMCacheEngine):
        self.engine = engine
        self.staging = engine.allocate_decode_staging()

    @torch.no_grad()
    def maybe_save(self, kv_caches: list[KDALayerCache], slot: int, token_ids: list[int]) -> bool:
        if not self.engine.config.save_decode_cache or len(token_ids) % self.engine.chunk_size:
            return False
        for layer, cache in enumerate(kv_caches):
            for dst, src in zip(self.staging[:4], cache[:4]):
                dst[layer].copy_(src[slot])
        return self.engine.store(token_ids, self.staging._replace(write_pos=int(kv_caches[0].write_pos[slot])))


# --------------------------------------------------------------------------------------------------- test fixtures

TINY_MODEL_CONFIG = {"model": "kimi-linear-tiny", "dtype": "bfloat16",
                     "linear_attn_config": {"kda_layers": [0, 2], "num_heads": 2, "head_dim": 4, "ring_len": 4}}
PROMPT = list(range(100, 116))
LOCAL_CPU = {"chunk_size": 8, "local_cpu": True, "max_local_cpu_size": 1}


def make_engine(instance_id: str, lmcache_config: dict, cache_dtype: str = "auto") -> LMCacheEngine:
    LMCacheEngineBuilder.destroy(instance_id)
    return init_lmcache_engine(TINY_MODEL_CONFIG, {"rank": 0}, {"cache_dtype": cache_dtype}, lmcache_config, instance_id)


def prefilled_kv_caches(engine: LMCacheEngine, num_slots: int = 2) -> list[KDALayerCache]:
    """KV caches after a prefill: random rings, log-decays in [lower_bound, 0)."""
    kv_caches = allocate_kda_kv_caches(engine.metadata, num_slots)
    for cache in kv_caches:
        for t in (cache.ssm_state, cache.d_cache, cache.k_cache):
            t.copy_(torch.randn(t.shape))
        cache.g_cache.copy_(-5.0 * torch.rand(cache.g_cache.shape))
        cache.write_pos.fill_(3)
    return kv_caches


def _stored(instance_id: str, lmcache_config: dict = LOCAL_CPU, cache_dtype: str = "auto"):
    engine = make_engine(instance_id, lmcache_config, cache_dtype)
    kv_caches = prefilled_kv_caches(engine)
    lmcache_store_replay_state(engine, kv_caches, 0, PROMPT)
    return engine, kv_caches


def build_store_in_kv_dtype():
    engine, kv_caches = _stored("kv-dtype", {**LOCAL_CPU, "save_in_kv_dtype": True})
    lmcache_retrieve_replay_state(engine, kv_caches, 1, PROMPT)
    return {"kv_caches": kv_caches, "chunk": engine.retrieve(PROMPT)[1]}


def build_retrieve_with_tail_rows():
    engine, kv_caches = _stored("tail-rows")
    n, H, HV, L, K, V = engine.metadata.kv_shape
    dt = engine.metadata.kv_dtype
    tail = (torch.randn(n, HV, 3, V).to(dt), torch.randn(n, H, 3, K).to(dt), (-5.0 * torch.rand(n, HV, 3, K)).to(dt))
    chunk = append_tail_rows(engine.retrieve(PROMPT + [1, 2, 3])[1], *tail)
    _scatter_slot(chunk, kv_caches, 1)
    return {"kv_caches": kv_caches, "chunk": chunk}


def build_prefetch_admit():
    engine, kv_caches = _stored("prefetch")
    buffer = ReplayPrefetchBuffer(engine.metadata, max_requests=2)
    buffer.prefetch(1, engine, PROMPT + [1, 2])
    buffer.admit(1, kv_caches, slot=1)
    return {"prefetch": buffer, "kv_caches": kv_caches}


def _lookahead(cache_dtype: str):
    engine, kv_caches = _stored(f"lookahead-{cache_dtype}", cache_dtype=cache_dtype)
    runner = ReplayLookaheadRunner(engine.metadata, num_slots=2)
    runner.load(0, engine.retrieve(PROMPT)[1], layer=1)
    _, H, HV, L, K, V = engine.metadata.kv_shape
    weights = {"A_log": torch.zeros(HV), "dt_bias": torch.zeros(HV * K)}
    mixed_qkv, a, b = (torch.randn(1, d).to(engine.metadata.kv_dtype) for d in (2 * H * K + HV * V, HV * K, HV))
    runner.step(weights, torch.tensor([0]), mixed_qkv, a, b)
    return {"decode": dict(c_ops.LAST_CALL), "kv_caches": kv_caches}


def build_lookahead_bf16():
    return _lookahead("auto")


def build_lookahead_fp32_cache():
    return _lookahead("float32")


def _decode_saver(engine: LMCacheEngine):
    saver = ReplayDecodeSaver(engine)
    saver.maybe_save(prefilled_kv_caches(engine), 1, PROMPT)
    return {"staging": saver.staging, "chunk": engine.retrieve(PROMPT)[1]}


def build_decode_saver():
    return _decode_saver(make_engine("decode-saver", {**LOCAL_CPU, "save_decode_cache": True}))


def build_decode_saver_fp32_gate():
    engine = make_engine("decode-saver-fp32", {**LOCAL_CPU, "save_decode_cache": True})
    return _decode_saver(LMCacheEngine(engine.config, dataclasses.replace(engine.metadata, gate_dtype=torch.float32)))
