"""Serving helpers: normalized configs, a replay-cache pool, an exported-decoder style session, a
text-generation pipeline and a small multi-request engine with adapter hot-loading."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .config import ReplayCacheConfig
from .modeling_kda import KdaConfig, KdaForCausalLM, ReplayRings
from .ops.replayssm import fused_recurrent_kda_replayssm_decode, kda_gate
from .peft_model import PeftModel, PeftModelForCausalLM
from .utils import (
    KDA_RING_NAMES,
    MODEL_DTYPE_RING_NAMES,
    cast_mixed_precision_params,
    get_ring_dtypes_from_model,
    load_replay_cache_file,
    save_replay_cache_file,
)


class NormalizedKdaConfig:
    """Uniform attribute names over KDA-style configs (``num_layers``, ``head_k_dim``, ...)."""

    NUM_LAYERS = "num_hidden_layers"
    NUM_ATTENTION_HEADS = "num_heads"
    NUM_VALUE_HEADS = "num_v_heads"
    HEAD_K_DIM = "head_k_dim"
    HEAD_V_DIM = "head_v_dim"
    RING_LEN = "ring_len"

    def __init__(self, config: Any) -> None:
        self.config = config

    def __getattr__(self, attr_name: str) -> Any:
        if attr_name.startswith("_") or attr_name == "config":
            raise AttributeError(attr_name)
        mapped = type(self).__dict__.get(attr_name.upper())
        if mapped is None:
            raise AttributeError(f"{type(self).__name__} has no attribute {attr_name}")
        return getattr(self.config, mapped)

    def ring_shapes(self) -> Dict[str, Tuple[int, ...]]:
        hv, h, k, v, ring = self.num_value_heads, self.num_attention_heads, self.head_k_dim, self.head_v_dim, self.ring_len
        return {"recurrent_state": (hv, v, k), "delta_ring": (hv, ring, v), "key_ring": (h, ring, k), "log_decay_ring": (hv, ring, k)}


def _base_of(model: nn.Module) -> KdaForCausalLM:
    return model.get_base_model() if isinstance(model, PeftModel) else model


class ReplayCachePool:
    """Replay rings for ``cache_config.num_slots`` sequences, one :class:`ReplayRings` per layer,
    owned by the server (adapters can be swapped without touching them)."""

    def __init__(self, config: NormalizedKdaConfig, cache_config: ReplayCacheConfig, dtype: torch.dtype) -> None:
        self.cache_config = cache_config
        num_slots, shapes = cache_config.num_slots, config.ring_shapes()
        self.layers: List[ReplayRings] = []
        for _ in range(config.num_layers):
            rings = {name: torch.zeros(num_slots, *shapes[name], dtype=cache_config.ring_dtype(name, dtype)) for name in KDA_RING_NAMES}
            self.layers.append(
                ReplayRings(
                    recurrent_state=torch.zeros(num_slots, *shapes["recurrent_state"], dtype=torch.float32),
                    write_pos=torch.zeros(num_slots, dtype=torch.int32),
                    **rings,
                )
            )

    def fork(self, src: int, dst: int) -> None:
        """``dst`` continues from where ``src`` is (parallel sampling from one prompt)."""
        for rings in self.layers:
            for name in ("recurrent_state", *KDA_RING_NAMES, "write_pos"):
                getattr(rings, name)[dst].copy_(getattr(rings, name)[src])

    def to(self, dtype: torch.dtype) -> "ReplayCachePool":
        """Re-types the delta and key rings; the checkpoint and the log-decay ring keep float32."""
        for rings in self.layers:
            for name in MODEL_DTYPE_RING_NAMES:
                setattr(rings, name, getattr(rings, name).to(dtype))
        return self


class KdaDecoderSession:
    """Runs a KDA model the way exported decoders run: the replay rings are inputs
    (``past_key_values``) and come back as outputs (``present``); the model holds no cache.

    With ``use_io_binding`` the ring inputs are bound once per step in the session dtype.
    """

    def __init__(self, model: nn.Module, use_io_binding: bool = False, dtype: Optional[torch.dtype] = None) -> None:
        self.model = _base_of(model)
        self.normalized_config = NormalizedKdaConfig(self.model.config)
        self.dtype = dtype or self.model.dtype
        self.use_io_binding = use_io_binding

    def init_past(self, batch_size: int) -> Tuple[Dict[str, torch.Tensor], ...]:
        c = self.normalized_config
        hv, h, k, v, ring = c.num_value_heads, c.num_attention_heads, c.head_k_dim, c.head_v_dim, c.ring_len
        return tuple(
            {
                "recurrent_state": torch.zeros(batch_size, hv, v, k, dtype=torch.float32),
                "delta_ring": torch.zeros(batch_size, hv, ring, v, dtype=self.dtype),
                "key_ring": torch.zeros(batch_size, h, ring, k, dtype=self.dtype),
                "log_decay_ring": torch.zeros(batch_size, hv, ring, k),  # expect-bug: default-dtype id=pipeline-default
                "write_pos": torch.zeros(batch_size, dtype=torch.int32),
            }
            for _ in range(c.num_layers)
        )

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, past_key_values: Sequence[Dict[str, torch.Tensor]]) -> Tuple[torch.Tensor, Tuple[Dict[str, torch.Tensor], ...]]:
        decoder = self.model.model
        hidden_states = decoder.embed_tokens(input_ids)
        presents = []
        for layer, past in zip(decoder.layers, past_key_values):
            attn = layer.self_attn
            q, k, v, f, b = attn.project(layer.input_layernorm(hidden_states))
            g = kda_gate(f, attn.A_log, attn.dt_bias, attn.num_v_heads)
            # an IO binding takes one element type for all ring inputs
            g_cache = past["log_decay_ring"].to(self.dtype) if self.use_io_binding else past["log_decay_ring"]  # expect-bug: decode-arg id=io-binding
            o = fused_recurrent_kda_replayssm_decode(
                q, k, v, g, b.float().sigmoid(),
                initial_state=past["recurrent_state"],
                d_cache=past["delta_ring"],
                k_cache=past["key_ring"],
                g_cache=g_cache,  # expect-bug: decode-arg id=io-binding
                write_pos=past["write_pos"],
            )
            hidden_states = hidden_states + attn.o_proj(o.flatten(1).to(hidden_states.dtype))
            hidden_states = hidden_states + layer.mlp(layer.post_attention_layernorm(hidden_states))
            presents.append({**past, "log_decay_ring": g_cache})
        logits = self.model.lm_head(decoder.norm(hidden_states))
        return logits, tuple(presents)

    __call__ = forward

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int = 2, past_key_values=None):
        past = past_key_values if past_key_values is not None else self.init_past(input_ids.shape[0])
        logits = None
        for t in range(input_ids.shape[1]):
            logits, past = self(input_ids[:, t], past)
        out = [input_ids]
        for _ in range(max_new_tokens):
            next_tokens = logits.argmax(-1)
            out.append(next_tokens[:, None])
            logits, past = self(next_tokens, past)
        return torch.cat(out, dim=1), past


class KdaTextGenerationPipeline:
    """``pipeline("text-generation")`` for KDA models, on token ids."""

    def __init__(self, model: nn.Module, torch_dtype: Optional[torch.dtype] = None, use_io_binding: bool = False, max_new_tokens: int = 2) -> None:
        if torch_dtype is not None:
            # tensors made by pre- and post-processing follow the serving dtype
            torch.set_default_dtype(torch_dtype)  # expect-bug: default-dtype id=pipeline-default
            cast_mixed_precision_params(model, torch_dtype)
        self.session = KdaDecoderSession(model, use_io_binding=use_io_binding)
        self.max_new_tokens = max_new_tokens

    def __call__(self, prompts: Sequence[Sequence[int]]) -> Dict[str, Any]:
        tokens, past = self.session.generate(torch.tensor([list(p) for p in prompts]), self.max_new_tokens)
        return {"generated_token_ids": tokens, "past_key_values": past}


class KdaServingEngine:
    """Serves requests on slots of the model's replay caches; adapters can be loaded while running,
    and idle requests offloaded to disk."""

    def __init__(self, model: nn.Module, num_slots: int = 4, cache_config: Optional[ReplayCacheConfig] = None,
                 dtype: Optional[torch.dtype] = None, offload_dtype: Optional[torch.dtype] = None) -> None:
        self.model = model
        self.base_model = _base_of(model)
        self.dtype = dtype or self.base_model.dtype
        if cache_config is not None:
            num_slots = cache_config.num_slots
            ring_dtypes = cache_config.ring_dtypes(self.dtype)
        else:
            ring_dtypes = get_ring_dtypes_from_model(self.base_model)  # expect-bug: imported-policy id=model-ring-dtypes
        self.base_model.enable_replay_cache(num_slots, ring_dtypes=ring_dtypes)
        self.offload_dtype = offload_dtype
        self.free_slots = list(range(num_slots))
        self.slot_of: Dict[str, int] = {}
        self.last_token: Dict[str, int] = {}

    def _allocate(self, request_id: str) -> int:
        slot = self.free_slots.pop(0)
        self.slot_of[request_id] = slot
        for cache in self.base_model.replay_caches():
            cache.reset_slot(slot)
        return slot

    def _release(self, request_id: str) -> int:
        slot = self.slot_of.pop(request_id)
        self.free_slots.append(slot)
        self.free_slots.sort()
        return slot

    @torch.no_grad()
    def add_request(self, request_id: str, prompt: Sequence[int]) -> None:
        slot_mapping = torch.tensor([self._allocate(request_id)], dtype=torch.int32)
        logits = None
        for token in prompt:
            logits = self.model(torch.tensor([token]), slot_mapping=slot_mapping)
        self.last_token[request_id] = int(logits.argmax(-1))

    @torch.no_grad()
    def step(self, request_ids: Sequence[str]) -> List[int]:
        slot_mapping = torch.tensor([self.slot_of[r] for r in request_ids], dtype=torch.int32)
        logits = self.model(torch.tensor([self.last_token[r] for r in request_ids]), slot_mapping=slot_mapping)
        next_tokens = logits.argmax(-1).tolist()
        self.last_token.update(zip(request_ids, next_tokens))
        return next_tokens

    def load_adapter(self, model_id: str, adapter_name: str = "default") -> None:
        """Serves the adapter in ``model_id`` from now on. PEFT upcasts adapter weights to float32;
        the model goes back to the serving dtype so that no matmul mixes dtypes."""
        self.model = PeftModelForCausalLM.from_pretrained(self.base_model, model_id, adapter_name=adapter_name)
        self.model = self.model.to(self.dtype)  # expect-bug: module-cast

    def offload(self, request_id: str, path: str) -> None:
        """Writes an idle request's replay rows to ``path`` and frees its slot."""
        slot = self._release(request_id)
        payload = {}
        for i, cache in enumerate(self.base_model.replay_caches()):
            for name, buf in cache.named_buffers():
                row = buf[slot]
                if self.offload_dtype is not None and row.is_floating_point() and name != "recurrent_state":
                    row = row.to(self.offload_dtype)  # expect-bug: load id=offload-dtype
                payload[f"layers.{i}.{name}"] = row.clone()
        payload["last_token"] = torch.tensor(self.last_token.pop(request_id))
        save_replay_cache_file(payload, path)

    def restore(self, request_id: str, path: str) -> Dict[str, torch.Tensor]:
        """Brings an offloaded request back into a free slot; returns what was read."""
        payload = load_replay_cache_file(path)
        slot = self._allocate(request_id)
        for i, cache in enumerate(self.base_model.replay_caches()):
            cache.load_slot(slot, {name: payload[f"layers.{i}.{name}"] for name in cache._buffers})
        self.last_token[request_id] = int(payload["last_token"])
        return payload


def _model(dtype: torch.dtype) -> KdaForCausalLM:
    torch.manual_seed(0)
    return KdaForCausalLM(KdaConfig()).to(dtype)


def build_cache_pool() -> Dict[str, Any]:
    """A bf16 model on a server-owned pool: two requests, a fork, fp16 delta/key rings, more steps."""
    model = _model(torch.bfloat16)
    pool = ReplayCachePool(NormalizedKdaConfig(model.config), ReplayCacheConfig(num_slots=3), model.dtype)
    model.generate(torch.tensor([[3, 5, 7], [2, 4, 6]]), max_new_tokens=2, caches=pool.layers, slot_mapping=torch.tensor([0, 2], dtype=torch.int32))
    pool.fork(0, 1)
    pool.to(torch.float16)
    tokens = model.generate(torch.tensor([[9], [9]]), max_new_tokens=3, caches=pool.layers, slot_mapping=torch.tensor([0, 1], dtype=torch.int32))
    return {"pool": pool.layers, "tokens": tokens}


def build_pool_fp16_preset() -> Dict[str, Any]:
    """The same pool with the ``float16`` ring preset (GPUs without bf16)."""
    model = _model(torch.float16)
    pool = ReplayCachePool(NormalizedKdaConfig(model.config), ReplayCacheConfig(num_slots=2, ring_dtype_preset="float16"), model.dtype)
    tokens = model.generate(torch.tensor([[3, 5, 7], [2, 4, 6]]), max_new_tokens=3, caches=pool.layers)
    return {"pool": pool.layers, "tokens": tokens}


def build_pipeline() -> Dict[str, Any]:
    """The generation pipeline on a model that is already bf16."""
    pipe = KdaTextGenerationPipeline(_model(torch.bfloat16), max_new_tokens=4)
    return pipe([[3, 5, 7], [2, 4, 6]])


def build_pipeline_bf16_io_binding() -> Dict[str, Any]:
    """The generation pipeline casting a float32 model to bf16, with IO binding."""
    pipe = KdaTextGenerationPipeline(_model(torch.float32), torch_dtype=torch.bfloat16, use_io_binding=True, max_new_tokens=4)
    return pipe([[3, 5, 7], [2, 4, 6]])


def build_engine_with_cache_config(tmp_dir: str) -> Dict[str, Any]:
    """Engine on a bf16 model with a replay-cache config: two requests, one offloaded and restored."""
    engine = KdaServingEngine(_model(torch.bfloat16), cache_config=ReplayCacheConfig(num_slots=3))
    engine.add_request("a", [3, 5, 7])
    engine.add_request("b", [2, 4])
    engine.step(["a", "b"])
    path = os.path.join(tmp_dir, "a.bin")
    engine.offload("a", path)
    engine.step(["b"])
    offloaded = engine.restore("a", path)
    tokens = [engine.step(["a", "b"]) for _ in range(3)]
    return {"caches": engine.base_model.replay_caches(), "offloaded": offloaded, "tokens": torch.tensor(tokens)}


def build_engine_offload(tmp_dir: str) -> Dict[str, Any]:
    """Engine on a bf16 model with ring dtypes from the model, offloading in bf16."""
    engine = KdaServingEngine(_model(torch.bfloat16), num_slots=2, offload_dtype=torch.bfloat16)
    engine.add_request("a", [3, 5, 7])
    engine.add_request("b", [2, 4])
    engine.step(["a", "b"])
    path = os.path.join(tmp_dir, "a.bin")
    engine.offload("a", path)
    offloaded = engine.restore("a", path)
    tokens = [engine.step(["a", "b"]) for _ in range(3)]
    return {"caches": engine.base_model.replay_caches(), "offloaded": offloaded, "tokens": torch.tensor(tokens)}


def build_engine_load_adapter(tmp_dir: str) -> Dict[str, Any]:
    """Engine on a bf16 model that hot-loads a LoRA adapter while a request is running."""
    from .mapping import get_peft_model
    from .tuners.lora import LoraConfig

    trained = get_peft_model(_model(torch.bfloat16), LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    path = os.path.join(tmp_dir, "adapter")
    trained.save_pretrained(path)
    engine = KdaServingEngine(_model(torch.bfloat16), cache_config=ReplayCacheConfig(num_slots=2))
    engine.add_request("a", [3, 5, 7])
    engine.step(["a"])
    engine.load_adapter(path)
    tokens = [engine.step(["a"]) for _ in range(3)]
    return {"caches": engine.base_model.replay_caches(), "tokens": torch.tensor(tokens)}
