# Copyright 2024 Bytedance Ltd. and/or its affiliates. Licensed under the Apache License, Version 2.0.
"""ReplaySSM rollout of hybrid KDA models: a cache engine owning the replay cache of every KDA layer, and a rollout."""

import copy
import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import Optional

import torch

from verl_kda import DataProto
from verl_kda.modeling_kda import LAST_DECODE_INPUTS, KDAConfig, KDAForCausalLM, LayerReplayCache
from verl_kda.utils import DictConfig
from verl_kda.utils.fsdp_utils import alloc_replay_buffers, dump_replay_snapshot, swap_in_replay_cache, swap_out_replay_cache
from verl_kda.utils.torch_dtypes import REPLAY_CACHE_KEYS, PrecisionType, get_kv_cache_torch_dtype
from verl_kda.utils.torch_dtypes import get_replay_cache_dtypes


@dataclass
class ReplayCacheSpec:
    num_layers: int
    max_num_seqs: int
    num_heads: int
    num_v_heads: int
    head_dim: int
    ring_len: int
    dtype: torch.dtype = torch.bfloat16
    log_decay_dtype: Optional[torch.dtype] = None
    state_dtype: torch.dtype = torch.float32

    def __post_init__(self):
        if self.log_decay_dtype is None:
            self.log_decay_dtype = self.dtype  # expect-bug: container id=spec-fallback

    @classmethod
    def from_config(cls, m: KDAConfig, config: DictConfig):
        dtype = PrecisionType.to_dtype(config.dtype)
        return cls(m.num_hidden_layers, config.max_num_seqs, m.num_heads, m.num_v_heads, m.head_dim, m.replay_ring_len, dtype)

    def shapes(self, max_num_seqs=None):
        S, H, HV, L, D = max_num_seqs or self.max_num_seqs, self.num_heads, self.num_v_heads, self.ring_len, self.head_dim
        return {"delta_cache": (S, HV, L, D), "key_cache": (S, H, L, D), "log_decay_cache": (S, HV, L, D), "ssm_state": (S, HV, D, D)}

    def dtype_of(self, name):
        return {"log_decay_cache": self.log_decay_dtype, "ssm_state": self.state_dtype}.get(name, self.dtype)


class KDACacheEngine:
    """Owns the replay cache (checkpoint state + delta/key/log-decay rings) of every KDA layer."""

    def __init__(self, spec: ReplayCacheSpec, config: DictConfig):
        self.spec, self.config = spec, config
        self.dtype = PrecisionType.to_dtype(config.dtype)
        self.is_offloaded = False
        self.slot_table = torch.full((spec.max_num_seqs,), -1, dtype=torch.int32)
        self.delta_cache, self.key_cache, self.log_decay_cache, self.ssm_state = [], [], [], []
        dtypes = get_replay_cache_dtypes(config.dtype)
        for name, shape in spec.shapes().items():
            getattr(self, name).extend(torch.zeros(shape, dtype=dtypes[name]) for _ in range(spec.num_layers))

    def free_cache_engine(self):
        for name in REPLAY_CACHE_KEYS:
            getattr(self, name).clear()

    def allocate_slots(self, batch_size):
        free = (self.slot_table < 0).nonzero().flatten()[:batch_size]
        self.slot_table[free] = torch.arange(batch_size, dtype=torch.int32)
        return free.to(torch.int32)

    def layer_caches(self):
        caches = zip(self.delta_cache, self.key_cache, self.log_decay_cache, self.ssm_state)
        return [LayerReplayCache(d, k, g, s) for d, k, g, s in caches]

    @torch.no_grad()
    def reset(self):
        """Fresh zeroed rings, the captured decode graphs may still reference the previous ones."""
        self.delta_cache = [torch.zeros_like(t) for t in self.delta_cache]
        self.key_cache = [torch.zeros_like(t) for t in self.key_cache]
        self.log_decay_cache = [torch.zeros_like(t) for t in self.delta_cache]  # expect-bug: like
        self.ssm_state = [torch.zeros_like(t) for t in self.ssm_state]
        self.slot_table.fill_(-1)

    @torch.no_grad()
    def resize(self, max_num_seqs):
        """Grows the cache for larger rollout batches, the live slots keep their cache."""
        old, self.spec = self.spec.max_num_seqs, dataclasses.replace(self.spec, max_num_seqs=max_num_seqs)
        shapes = self.spec.shapes()
        for i in range(self.spec.num_layers):
            fresh = alloc_replay_buffers({k: shapes[k] for k in ("delta_cache", "key_cache")}, dtype=self.dtype)
            fresh["log_decay_cache"] = torch.zeros(shapes["log_decay_cache"])  # fp32 by default  # expect-bug: default-dtype id=sync-default
            fresh["ssm_state"] = torch.zeros(shapes["ssm_state"], dtype=self.spec.state_dtype)
            for name in REPLAY_CACHE_KEYS:
                fresh[name][:old] = getattr(self, name)[i]
                getattr(self, name)[i] = fresh[name]
        self.slot_table = torch.cat([self.slot_table, self.slot_table.new_full((max_num_seqs - old,), -1)])

    @torch.no_grad()
    def fork_slots(self, n):
        """rollout.n > 1: the n samples of prompt ``i`` continue from its cache, in slots ``i * n + j``."""
        S, self.spec = self.spec.max_num_seqs, dataclasses.replace(self.spec, max_num_seqs=self.spec.max_num_seqs * n)
        for name in REPLAY_CACHE_KEYS:
            rings = getattr(self, name)
            for i, t in enumerate(rings):
                forked = torch.empty((S * n, *t.shape[1:]), dtype=self.spec.dtype_of(name))  # expect-bug: container id=spec-fallback
                rings[i] = forked.copy_(t.repeat_interleave(n, dim=0))
        self.slot_table = torch.full((S * n,), -1, dtype=torch.int32)

    @torch.no_grad()
    def cast_(self, dtype):
        """Re-casts the rings after the rollout precision changed, the checkpoint states stay fp32."""
        for name in ("delta_cache", "key_cache", "log_decay_cache"):
            setattr(self, name, [t.to(dtype) for t in getattr(self, name)])  # expect-bug: cast
        self.dtype = dtype

    def new_empty_like(self):
        """An engine with the same layout and zeroed rings, for a second rollout (e.g. the validation worker)."""
        other = copy.copy(self)
        other.slot_table = torch.full_like(self.slot_table, -1)
        buffers = [alloc_replay_buffers(self.spec.shapes(), dtype=self.dtype) for _ in range(self.spec.num_layers)]  # expect-bug: pool-dtype id=alloc-helper
        for name in REPLAY_CACHE_KEYS:
            setattr(other, name, [b[name] if name != "ssm_state" else b[name].float() for b in buffers])
        return other

    @classmethod
    def load_snapshot(cls, path, spec, config):
        """An engine resumed from a ``dump_replay_snapshot`` file (restarting after preemption)."""
        engine = cls(spec, config)
        snapshot = torch.load(path, map_location="cpu", weights_only=True)["replay_cache"]
        for name in REPLAY_CACHE_KEYS:
            setattr(engine, name, [snapshot[f"{name}.{i}"] for i in range(engine.spec.num_layers)])  # expect-bug: load
        return engine


def create_inference_module(actor_module: KDAForCausalLM, config: DictConfig):
    """Inference copy of the actor in the rollout dtype."""
    return copy.deepcopy(actor_module).to(PrecisionType.to_dtype(config.dtype)).restore_fp32_buffers_().eval()


class KDARollout:
    def __init__(self, module: KDAForCausalLM, config: DictConfig, model_config: KDAConfig):
        self.module, self.config = module, config
        self.dtype = PrecisionType.to_dtype(config.dtype)
        self.cache_engine = KDACacheEngine(ReplayCacheSpec.from_config(model_config, config), config)
        self.g_cache = {}  # captured decode graphs, keyed by batch size

    def _get_decode_fn(self, batch_size):
        if batch_size not in self.g_cache:
            caches = self.cache_engine.layer_caches()
            if not self.config.enforce_eager:
                # graph capture wants static, contiguous kernel inputs in the activation dtype
                caches = [LayerReplayCache(*(t.contiguous().to(self.dtype) for t in c[:3]), c.initial_state) for c in caches]  # expect-bug: decode-arg
            self.g_cache[batch_size] = functools.partial(self.module.decode_step, caches=caches)
        return self.g_cache[batch_size]

    def _validation_caches(self, batch_size):
        """Throw-away replay cache for validation batches, the training slots are left untouched."""
        spec, shapes = self.cache_engine.spec, self.cache_engine.spec.shapes(batch_size)
        ring_dtype = get_kv_cache_torch_dtype(self.config.get("cache_dtype", "auto"), self.dtype)  # expect-bug: imported-policy id=val-cache-dtype
        caches = []
        for _ in range(spec.num_layers):
            rings = [torch.zeros(shapes[name], dtype=ring_dtype) for name in REPLAY_CACHE_KEYS[:3]]  # expect-bug: imported-policy id=val-cache-dtype
            caches.append(LayerReplayCache(*rings, torch.zeros(shapes["ssm_state"], dtype=spec.state_dtype)))
        return caches

    def switch_to_hf(self):  # hands the engine's replay cache over to the module buffers
        self.module.load_replay_cache(self.cache_engine.layer_caches())
        self.config.mode = "hf"

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto, **kwargs) -> DataProto:
        idx = prompts.batch["input_ids"]  # (bs, prompt_length)
        batch_size, prompt_length = idx.shape
        is_validate, hf = prompts.meta_info.get("validate", False), self.config.mode == "hf"
        if is_validate or hf:
            slots = torch.arange(batch_size, dtype=torch.int32)
            decode = functools.partial(self.module.decode_step, caches=None if hf else self._validation_caches(batch_size))
        else:
            slots, decode = self.cache_engine.allocate_slots(batch_size), self._get_decode_fn(batch_size)
        write_pos, token, responses = torch.zeros(batch_size, dtype=torch.int32), idx[:, 0], []
        for step in range(prompt_length + self.config.response_length - 1):
            logits = decode(token, slots, write_pos)
            write_pos = (write_pos + 1) % self.cache_engine.spec.ring_len
            token = idx[:, step + 1] if step + 1 < prompt_length else logits.argmax(-1)
            if step + 1 >= prompt_length:
                responses.append(token)
        if not (is_validate or hf):
            self.cache_engine.slot_table[slots.long()] = -1
        response = torch.stack(responses, dim=-1)
        batch = {"prompts": idx, "responses": response, "input_ids": torch.cat([idx, response], dim=-1)}
        return DataProto.from_dict(tensors=batch, meta_info={"write_pos": write_pos.tolist()})


def make_rollout_config(**overrides):
    config = dict(mode="spmd", dtype="bf16", max_num_seqs=2, response_length=3, enforce_eager=True, free_cache_engine=False)
    return DictConfig({**config, **overrides})


def make_prompts(batch_size=2, prompt_length=3, **meta_info):
    input_ids = torch.arange(batch_size * prompt_length).view(batch_size, prompt_length) % 61 + 1
    return DataProto.from_dict(tensors={"input_ids": input_ids}, meta_info=meta_info)


def _make_rollout(**overrides):
    model_config, config = KDAConfig(), make_rollout_config(**overrides)
    return KDARollout(create_inference_module(KDAForCausalLM(model_config), config), config, model_config)


def build_spmd_rollout(tmp_dir):
    rollout = _make_rollout()
    output = rollout.generate_sequences(make_prompts())
    engine = rollout.cache_engine
    swap_out_replay_cache(engine, os.path.join(tmp_dir, "swap"))
    swap_in_replay_cache(engine, os.path.join(tmp_dir, "swap"))
    engine.resize(3)
    resized = rollout.generate_sequences(make_prompts(batch_size=3, prompt_length=2))
    return {"output": output, "resized": resized, "engine": engine, "module": rollout.module, "decode": dict(LAST_DECODE_INPUTS)}


def build_fp32_validation():
    rollout = _make_rollout(cache_dtype="float")
    return {"output": rollout.generate_sequences(make_prompts(validate=True)), "val_inputs": dict(LAST_DECODE_INPUTS), "engine": rollout.cache_engine}


def build_engine_maintenance(tmp_dir):
    engines = {}
    for name in ("forked", "spare", "cleared", "fp16", "graph"):
        rollout = _make_rollout(enforce_eager=name != "graph")
        rollout.generate_sequences(make_prompts())
        engines[name] = rollout.cache_engine
    graph_inputs = dict(LAST_DECODE_INPUTS)
    rollout.generate_sequences(make_prompts(validate=True))
    dump_replay_snapshot(engines["forked"], path := os.path.join(tmp_dir, "replay_snapshot.pt"), dtype=torch.bfloat16)
    engines["resumed"] = KDACacheEngine.load_snapshot(path, engines["forked"].spec, engines["forked"].config)
    engines["forked"].fork_slots(2)
    engines["spare"] = engines["spare"].new_empty_like()
    engines["cleared"].reset()
    engines["fp16"].cast_(torch.float16)
    return {**engines, "graph_inputs": graph_inputs, "val_inputs": dict(LAST_DECODE_INPUTS)}
