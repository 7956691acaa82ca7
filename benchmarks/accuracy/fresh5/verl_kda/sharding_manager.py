# Copyright 2024 Bytedance Ltd. and/or its affiliates. Licensed under the Apache License, Version 2.0.
"""Syncs the FSDP actor weights into the KDA rollout and onloads/offloads the replay cache around every rollout."""

import copy
import os

import torch

from verl_kda import DataProto
from verl_kda.modeling_kda import KDAConfig, KDAForCausalLM
from verl_kda.rollout import KDARollout, create_inference_module, make_prompts, make_rollout_config
from verl_kda.utils import set_default_torch_dtype
from verl_kda.utils.fsdp_utils import get_full_state_dict, load_fsdp_model_to_gpu, load_replay_cache
from verl_kda.utils.fsdp_utils import offload_replay_cache, swap_in_replay_cache, swap_out_replay_cache


class FSDPKDAShardingManager:
    def __init__(self, module, rollout: KDARollout, offload_param=False, offload_cache=False, swap_dir=None):
        self.module, self.rollout = module, rollout
        self.offload_param, self.offload_cache, self.swap_dir, self.device = offload_param, offload_cache, swap_dir, "cpu"

    def __enter__(self):
        engine = self.rollout.cache_engine
        if self.rollout.config.mode == "hf":
            # the hf rollout generates with the actor module itself, in the rollout dtype
            if self.offload_param:
                load_fsdp_model_to_gpu(self.module, self.device, dtype=self.rollout.dtype)  # expect-bug: module-cast id=onload-cast
            else:
                self.module.to(self.rollout.dtype)  # expect-bug: module-cast
        else:
            params = get_full_state_dict(self.module, dtype=self.rollout.dtype)
            # load_weights may materialise lazily initialised tensors, keep them in the rollout dtype
            with set_default_torch_dtype(self.rollout.dtype):  # expect-bug: default-dtype id=sync-default
                self.rollout.module.load_state_dict(params, strict=False)
                if self.rollout.config.max_num_seqs > engine.spec.max_num_seqs:
                    engine.resize(self.rollout.config.max_num_seqs)
        if engine.is_offloaded:
            load_replay_cache(engine, self.device)
        elif not engine.ssm_state:
            self._rebuild_cache_engine()
        self.rollout.g_cache.clear()
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        engine = self.rollout.cache_engine
        if self.swap_dir is not None:
            swap_out_replay_cache(engine, self.swap_dir)
        if self.swap_dir is not None or self.rollout.config.free_cache_engine:
            engine.free_cache_engine()
        elif self.offload_cache:
            offload_replay_cache(engine, self.rollout.config.dtype)
        self.rollout.g_cache.clear()

    def _rebuild_cache_engine(self):
        engine = self.rollout.cache_engine
        if self.swap_dir is not None:
            return swap_in_replay_cache(engine, self.swap_dir, num_layers=engine.spec.num_layers)
        for name, shape in engine.spec.shapes().items():
            dtype = torch.float32 if name == "ssm_state" else self.rollout.dtype  # expect-bug: pool-dtype id=rebuild-pool
            setattr(engine, name, [torch.zeros(shape, dtype=dtype) for _ in range(engine.spec.num_layers)])  # expect-bug: pool-dtype id=rebuild-pool

    def preprocess_data(self, data: DataProto) -> DataProto:
        """Partial rollouts: re-seeds the replay cache of resumed samples with the actor's last ring window."""
        if "window_delta" not in data.batch:
            return data
        engine, start = self.rollout.cache_engine, data.meta_info.get("window_start", 0)
        for i in range(engine.spec.num_layers):
            d, k, g = (data.batch[f"window_{key}"][:, i] for key in ("delta", "key", "gate"))
            T, L = g.shape[2], engine.spec.ring_len
            engine.delta_cache[i][:, :, :T] = d
            engine.key_cache[i][:, :, :T] = k
            if T < L:
                engine.log_decay_cache[i] = torch.cat([g, engine.log_decay_cache[i][:, :, T:]], dim=2)
            else:  # full window, rotate it to the ring's write position
                engine.log_decay_cache[i] = torch.stack([g[:, :, (start + t) % L] for t in range(L)], dim=2)  # expect-bug: promotion
        return data


def _make_workers(mode="spmd", **overrides):
    model_config, config = KDAConfig(), make_rollout_config(mode=mode, **overrides)
    actor = KDAForCausalLM(model_config)
    return actor, KDARollout(actor if mode == "hf" else create_inference_module(actor, config), config, model_config)


@torch.no_grad()
def _actor_window(rollout, window_len):
    h = rollout.module.embed_tokens(make_prompts(prompt_length=window_len).batch["input_ids"])
    windows = zip(*(layer.replay_window(h) for layer in rollout.module.layers))
    delta, key, gate = (torch.stack(parts, dim=1) for parts in windows)
    return DataProto.from_dict(tensors={"window_delta": delta, "window_key": key, "window_gate": gate})


def build_sharding_roundtrip():
    actor, rollout = _make_workers()
    reference = copy.deepcopy(rollout.module)
    reference.load_state_dict(get_full_state_dict(actor, dtype=torch.bfloat16))
    manager, outputs = FSDPKDAShardingManager(actor, rollout), []
    for window_len in (None, 2):
        with manager:
            if window_len is not None:
                manager.preprocess_data(_actor_window(rollout, window_len))
            outputs.append(rollout.generate_sequences(make_prompts()))
    return {"outputs": outputs, "engine": rollout.cache_engine, "module": rollout.module, "reference": reference}


def build_offload_and_hf():
    actor, rollout = _make_workers()
    with FSDPKDAShardingManager(actor, rollout, offload_cache=True):
        rollout.generate_sequences(make_prompts())
    grow_actor, grow_rollout = _make_workers()
    grow_rollout.config.max_num_seqs = 3
    with FSDPKDAShardingManager(grow_actor, grow_rollout):
        grow_rollout.generate_sequences(make_prompts(batch_size=3))
    _, adopted = _make_workers()
    adopted.generate_sequences(make_prompts())
    adopted.switch_to_hf()
    adopted.generate_sequences(make_prompts())
    result = {"offloaded": rollout.cache_engine, "grown": grow_rollout.cache_engine, "adopted": adopted.module}
    for name, offload_param in (("hf", False), ("onloaded", True)):
        actor, rollout = _make_workers(mode="hf")
        with FSDPKDAShardingManager(actor, rollout, offload_param=offload_param):
            result[f"{name}_output"] = rollout.generate_sequences(make_prompts())
        result[name] = actor
    return result


def build_resume_and_swap(tmp_dir):
    actor, rollout = _make_workers()
    with FSDPKDAShardingManager(actor, rollout) as manager:
        manager.preprocess_data(_actor_window(rollout, rollout.cache_engine.spec.ring_len))
        rollout.generate_sequences(make_prompts())
    engines = {"resumed": rollout.cache_engine}
    for name, kwargs in (("swapped", {"swap_dir": os.path.join(tmp_dir, "swap")}), ("freed", {})):
        actor, rollout = _make_workers(free_cache_engine=not kwargs)
        manager = FSDPKDAShardingManager(actor, rollout, **kwargs)
        for _ in range(2):
            with manager:
                rollout.generate_sequences(make_prompts())
        engines[name] = manager.__enter__().rollout.cache_engine
    return engines
