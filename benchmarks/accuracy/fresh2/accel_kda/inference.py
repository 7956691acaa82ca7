"""Decoding with a dispatched KDA model: captured decode steps, host-offloaded and swapped ReplaySSM buffers."""

import os
from typing import Optional

import torch
import torch.nn as nn

from .big_modeling import dispatch_model
from .hooks import ReplayDecodeHook, add_hook_to_module
from .kernels import fused_recurrent_kda_replayssm_decode, last_decode_call
from .modeling_kda import KdaConfig, KdaForCausalLM, KimiDeltaAttention, ReplayLayerCache
from .utils.dataclasses import ReplayCacheKwargs
from .utils.modeling import get_ring_dtype
from .utils.offload import DiskCacheSwapper


class CudaGraphDecodeRunner(nn.Module):
    """Static buffers for a captured decode step of one KDA layer, its ReplaySSM buffers copied in; `replay()` runs
    the step (eagerly on CPU, as a `torch.cuda.CUDAGraph` replay on GPU)."""

    def __init__(self, attn: KimiDeltaAttention, max_batch_size: int, dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.__dict__["attn"] = attn  # not a submodule: the runner does not own the layer's weights
        replay, HV = attn.replay, attn.num_v_heads
        self.register_buffer("static_mixed_qkv", torch.zeros(max_batch_size, attn.qkv_proj.out_features, dtype=dtype), persistent=False)
        self.register_buffer("static_a", torch.zeros(max_batch_size, HV * attn.head_k_dim, dtype=dtype), persistent=False)
        self.register_buffer("static_b", torch.zeros(max_batch_size, HV, dtype=dtype), persistent=False)
        self.register_buffer("static_out", torch.zeros(max_batch_size, HV, attn.head_v_dim, dtype=dtype), persistent=False)
        self.register_buffer("static_slot_ids", torch.zeros(max_batch_size, dtype=torch.long), persistent=False)
        for name in ("state", "d_cache", "k_cache", "g_cache", "write_pos"):
            self.register_buffer(f"static_{name}", getattr(replay, name).clone(), persistent=False)

    @torch.no_grad()
    def replay(self, hidden_states: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
        attn, n = self.attn, hidden_states.shape[0]
        self.static_mixed_qkv[:n].copy_(attn.qkv_proj(hidden_states))
        self.static_a[:n].copy_(attn.a_proj(hidden_states))
        self.static_b[:n].copy_(attn.b_proj(hidden_states))
        self.static_slot_ids[:n].copy_(slot_ids)
        fused_recurrent_kda_replayssm_decode(
            self.static_mixed_qkv, self.static_a, self.static_b, attn.A_log, attn.dt_bias, attn.scale,
            self.static_state, self.static_d_cache, self.static_k_cache, self.static_g_cache, self.static_out,
            self.static_slot_ids, self.static_write_pos, use_qk_l2norm_in_kernel=True, lower_bound=attn.lower_bound,
        )
        return self.static_out[:n]


def capture_decode_runners(model: KdaForCausalLM, max_batch_size: int) -> dict[str, CudaGraphDecodeRunner]:
    """One runner per KDA layer, its static inputs in the dtype of the model."""
    runners = {}
    for idx, layer in enumerate(model.layers):
        runner = CudaGraphDecodeRunner(layer.self_attn, max_batch_size)
        runners[f"layers.{idx}"] = runner.to(model.dtype)  # expect-bug: module-cast
    return runners


class OffloadedReplayCache:
    """ReplaySSM buffers of every layer kept in host memory; `stage(layer_idx)` puts one layer's on the execution
    device for a step."""

    def __init__(self, config: KdaConfig, torch_dtype: torch.dtype):
        slots, L, H, HV = config.replay_num_slots, config.replay_ring_len, config.num_heads, config.num_v_heads
        K, V, n = config.head_k_dim, config.head_v_dim, config.num_hidden_layers
        shapes = {"initial_state": (HV, V, K), "d_cache": (HV, L, V), "k_cache": (H, L, K), "g_cache": (HV, L, K)}
        self.host = {}
        for name, shape in shapes.items():
            self.host[name] = torch.zeros(n, slots, *shape, dtype=get_ring_dtype(name, torch_dtype))  # expect-bug: imported-policy id=ring-policy
        self.write_pos = torch.zeros(n, slots, dtype=torch.int32)

    def stage(self, layer_idx: int, device="cpu") -> ReplayLayerCache:
        staged = {name: buffer[layer_idx].to(device, non_blocking=True) for name, buffer in self.host.items()}
        write_pos = self.write_pos[layer_idx].to(device)
        return ReplayLayerCache(staged["initial_state"], staged["d_cache"], staged["k_cache"], staged["g_cache"], write_pos)


def _replay_buffers(attn: KimiDeltaAttention) -> dict[str, torch.Tensor]:
    replay = attn.replay
    return {"initial_state": replay.state, "d_cache": replay.d_cache, "k_cache": replay.k_cache, "g_cache": replay.g_cache}


class ReplaySwapPool:
    """Host copies of the ReplaySSM buffers of preempted slots, in the dtypes of `ReplayCacheKwargs.buffer_dtypes()`."""

    def __init__(self, model: KdaForCausalLM, cache_kwargs: ReplayCacheKwargs):
        dtypes = cache_kwargs.buffer_dtypes()
        self.layers = [
            {name: torch.zeros_like(buf, dtype=dtypes[name], device="cpu") for name, buf in _replay_buffers(layer.self_attn).items()}
            for layer in model.layers
        ]

    @torch.no_grad()
    def swap(self, model: KdaForCausalLM, slot: int, out: bool = True):
        for pool, layer in zip(self.layers, model.layers):
            for name, buf in _replay_buffers(layer.self_attn).items():
                if out:
                    pool[name][slot].copy_(buf[slot])
                else:
                    buf[slot].copy_(pool[name][slot])


class ReplayGenerator:
    """Greedy decoding with a dispatched KDA model, one token per step for each running slot."""

    def __init__(self, model: KdaForCausalLM, device_map: Optional[dict] = None, dtype: Optional[torch.dtype] = None):
        self.model = dispatch_model(model, device_map or {"": "cpu"}, input_dtype=dtype)  # expect-bug: cast id=input-cast

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, slot_ids, caches=self.model.replay_caches()).argmax(-1)


def attach_replay_decode_hooks(model: KdaForCausalLM, cache_kwargs: ReplayCacheKwargs) -> KdaForCausalLM:
    for layer in model.layers:
        add_hook_to_module(layer.self_attn, ReplayDecodeHook(cache_kwargs.num_slots, cache_kwargs.ring_len, dtype=cache_kwargs.ring_dtype))
    return model


def _bf16_model() -> KdaForCausalLM:
    return KdaForCausalLM(KdaConfig()).to(torch.bfloat16)


def build_capture_decode_runners_bf16():
    model = _bf16_model()
    runners = capture_decode_runners(model, max_batch_size=2)
    runners["layers.0"].replay(model.embed_tokens(torch.tensor([4, 7])), torch.tensor([0, 1]))
    return runners


def build_cuda_graph_runner_static_dtype():
    model = _bf16_model()
    runner = CudaGraphDecodeRunner(model.layers[0].self_attn, max_batch_size=2, dtype=model.dtype)
    runner.replay(model.embed_tokens(torch.tensor([4, 7])), torch.tensor([1, 0]))
    return {"runner": runner, "decode": last_decode_call()}


def build_offloaded_replay_cache_bf16():
    model, cache = _bf16_model(), OffloadedReplayCache(KdaConfig(), torch.bfloat16)
    with torch.no_grad():
        hidden = model.embed_tokens(torch.tensor([2, 3]))
        for idx, layer in enumerate(model.layers):
            hidden = layer(hidden, torch.tensor([0, 1]), cache=cache.stage(idx))
    return {"host": cache.host, "write_pos": cache.write_pos}


def build_swap_pool_bf16():
    model = _bf16_model()
    with torch.no_grad():
        model.layers[0].self_attn.seed_slot(0, model.embed_tokens(torch.arange(5)))
    pool = ReplaySwapPool(model, ReplayCacheKwargs(mixed_precision="bf16"))
    pool.swap(model, slot=0, out=True)
    pool.swap(model, slot=1, out=False)
    return {"pool": pool.layers, "model": model}


def _swapped_out(tmp_dir):
    model = _bf16_model()
    with torch.no_grad():
        model.layers[1].self_attn.seed_slot(1, model.embed_tokens(torch.arange(6)))
    swapper = DiskCacheSwapper(os.path.join(tmp_dir, "swap"), model.dtype)
    swapper.swap_out("layers.1", _replay_buffers(model.layers[1].self_attn), slot=1)
    return swapper, model


def build_disk_swap_in_bf16(tmp_dir):
    swapper, model = _swapped_out(tmp_dir)
    return {"restored": swapper.swap_in("layers.1", slot=1), "model": model}


def build_disk_load_slot_bf16(tmp_dir):
    swapper, model = _swapped_out(tmp_dir)
    return {"restored": swapper.load_slot("layers.1", slot=1), "model": model}


def build_generator_bf16():
    generator = ReplayGenerator(_bf16_model(), dtype=torch.bfloat16)
    generator.step(torch.tensor([1, 9]), torch.tensor([0, 1]))
    return {"model": generator.model, "decode": last_decode_call()}


def build_dispatch_skip_caches_bf16():
    model = dispatch_model(_bf16_model(), {"": "cpu"}, skip_keys="caches", input_dtype=torch.bfloat16)
    with torch.no_grad():
        model(torch.tensor([1, 9]), torch.tensor([0, 1]), caches=model.replay_caches())
    return {"model": model, "decode": last_decode_call()}


def _run_hooked_layers(model: KdaForCausalLM) -> list:
    steps = []
    with torch.no_grad():
        hidden = model.embed_tokens(torch.tensor([5, 6]))
        for layer in model.layers:
            layer.self_attn(hidden, torch.tensor([0, 1]))
            steps.append(last_decode_call())
    return steps


def build_replay_decode_hooks_bf16():
    model = attach_replay_decode_hooks(_bf16_model(), ReplayCacheKwargs(mixed_precision="bf16"))
    return {"model": model, "steps": _run_hooked_layers(model)}


def build_replay_decode_hooks_fp32():
    model = attach_replay_decode_hooks(KdaForCausalLM(KdaConfig()), ReplayCacheKwargs())
    return {"model": model, "steps": _run_hooked_layers(model)}
