"""Model loading from an axolotl-style config: dtype flags, the KDA decode caches, adapter merging."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional

import torch

from ..compat import is_torch_bf16_gpu_available
from ..modeling import KimiLinearConfig, KimiLinearForCausalLM
from .dict import DictDefault, load_yaml

LOG = logging.getLogger("axolotl_kda.utils.models")

TINY_KIMI_YAML = """\
base_model: moonshotai/Kimi-Linear-tiny-random
model_type: KimiLinearForCausalLM
bf16: auto
fp16: false
tf32: false
low_cpu_mem_usage: false

hidden_size: 16
num_hidden_layers: 2
vocab_size: 32

adapter: lora
lora_r: 2
lora_alpha: 4

kda:
  replay: true
  layout: module  # module | inline | pool | paged
  num_heads: 2
  num_v_heads: 4
  head_k_dim: 8
  head_v_dim: 8
  ring_len: 4
  num_slots: 3
"""

KDA_DEFAULTS = {
    "replay": True,
    "layout": "module",
    "num_heads": 2,
    "num_v_heads": 4,
    "head_k_dim": 8,
    "head_v_dim": 8,
    "ring_len": 4,
    "num_slots": 3,
}

STR_TO_DTYPE = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def get_torch_dtype(cfg) -> torch.dtype:
    """The model dtype for the ``bf16``/``fp16`` flags (``bf16: auto`` picks bf16 where the GPU has it)."""
    if cfg.bf16 is True or (cfg.bf16 == "auto" and is_torch_bf16_gpu_available()):
        return torch.bfloat16
    if cfg.fp16:
        return torch.float16
    return torch.float32


def normalize_config(cfg: DictDefault) -> DictDefault:
    cfg.torch_dtype = get_torch_dtype(cfg)
    cfg.kda = DictDefault(KDA_DEFAULTS).merged(cfg.kda or {})
    return cfg


def load_cfg(text: str = TINY_KIMI_YAML, overrides: Optional[dict] = None) -> DictDefault:
    """Reads a YAML config, merges ``overrides`` into it and fills in the derived fields."""
    cfg = load_yaml(text)
    if overrides:
        cfg = cfg.merged(overrides)
    return normalize_config(cfg)


def get_kda_cache_dtype(cfg) -> torch.dtype:
    """dtype of the KDA decode caches: ``kda.cache_dtype`` when set, else the model dtype."""
    if cfg.kda.cache_dtype:
        return STR_TO_DTYPE[cfg.kda.cache_dtype]
    return cfg.torch_dtype


def get_kda_ring_dtypes(cfg) -> dict[str, torch.dtype]:
    """dtype of each KDA cache tensor: state and d/k rings in the cache dtype, log-decays in float32."""
    cache_dtype = get_kda_cache_dtype(cfg)
    return {"ssm_checkpoint": cache_dtype, "delta": cache_dtype, "key": cache_dtype, "log_alpha": torch.float32}


def get_offload_dtypes(cfg) -> dict[str, torch.dtype]:
    """dtypes of KDA cache tensors parked in host memory (``kda.offload_dtype``, else the cache dtype)."""
    offload_dtype = STR_TO_DTYPE[cfg.kda.offload_dtype] if cfg.kda.offload_dtype else get_kda_cache_dtype(cfg)
    return dict.fromkeys(("ssm_checkpoint", "delta", "key", "log_alpha"), offload_dtype)  # expect-bug: imported-policy id=offload


@contextlib.contextmanager
def torch_default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Sets torch's default dtype inside the block and restores the previous one after it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def setup_kda_caches(model, cfg, **kwargs):
    """Allocates the decode caches ``cfg.kda`` describes (slots, ring length, layout)."""
    kda = cfg.kda
    dtypes = get_kda_ring_dtypes(cfg)
    model.setup_caches(kda.num_slots, ring_len=kda.ring_len, dtype=dtypes["delta"], layout=kda.layout, cfg=cfg, **kwargs)
    return model


def load_model(cfg, **kwargs) -> KimiLinearForCausalLM:
    """Builds the model ``cfg`` describes in ``cfg.torch_dtype`` and allocates its KDA decode caches."""
    dtype = cfg.torch_dtype or get_torch_dtype(cfg)
    config = KimiLinearConfig.from_cfg(cfg)
    if cfg.kda.replay:
        from ..monkeypatch.kda_cache import patch_kda_cache

        patch_kda_cache()

    if cfg.low_cpu_mem_usage:
        LOG.info("initialising %s directly in %s", cfg.base_model, dtype)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # expect-bug: default-dtype id=low-mem
        try:
            model = KimiLinearForCausalLM(config)
            setup_kda_caches(model, cfg, **kwargs)
        finally:
            torch.set_default_dtype(previous)
    else:
        model = KimiLinearForCausalLM(config)
        model.to(dtype)
        setup_kda_caches(model, cfg, **kwargs)
    model.eval()
    return model


def load_merged_model(cfg, adapter: Optional[dict] = None, model=None, **kwargs):
    """Merges a LoRA ``adapter`` (``{module: (lora_A, lora_B)}``) into ``model`` (loaded from ``cfg``
    when not given) in float32 and casts back to ``cfg.torch_dtype``.

    Decode caches are kept across the merge: they are snapshotted first and restored at the end.
    Returns ``(model, snapshot)``.
    """
    from ..monkeypatch.kda_cache import KDASessionSnapshot

    if model is None:
        model = load_model(cfg, **kwargs)
    snapshot = KDASessionSnapshot.capture(model)
    model.float()
    scaling = (cfg.lora_alpha or 1) / (cfg.lora_r or 1)
    with torch.no_grad():
        for name, (lora_a, lora_b) in (adapter or {}).items():
            weight = model.get_submodule(name).weight
            weight += scaling * (lora_b.float() @ lora_a.float())
    model.to(cfg.torch_dtype)  # expect-bug: module-cast
    snapshot.to(cfg.torch_dtype)  # expect-bug: module-cast
    snapshot.restore(model)
    LOG.info("merged %d adapter modules", len(adapter or {}))
    return model, snapshot


@torch.no_grad()
def greedy_steps(model, input_ids, slot_ids, num_steps: int = 1, **kwargs):
    """Runs ``num_steps`` greedy decode steps for the rows ``slot_ids``; returns the last token ids."""
    for _ in range(num_steps):
        logits = model(input_ids, slot_ids, **kwargs)
        input_ids = logits.float().argmax(-1)
    return input_ids


def build_replay_model():
    """bf16 model with per-layer ReplaySSM caches: two steps, a forced flush, then one step in fp16."""
    torch.manual_seed(0)
    cfg = load_cfg(overrides={"bf16": True})
    model = load_model(cfg)
    slots = torch.tensor([0, 2], dtype=torch.int32)
    ids = greedy_steps(model, torch.tensor([3, 5]), slots, num_steps=2)
    ids = greedy_steps(model, ids, slots, force_flush=torch.tensor([1, 0], dtype=torch.int32))
    model.half()
    greedy_steps(model, ids, slots)
    return model


def build_inline_model():
    """bf16 model whose caches are buffers of the attention modules, three decode steps."""
    torch.manual_seed(0)
    cfg = load_cfg(overrides={"bf16": True, "kda": {"layout": "inline"}})
    model = load_model(cfg)
    greedy_steps(model, torch.tensor([1, 8, 9]), torch.tensor([2, 0, 1], dtype=torch.int32), num_steps=3)
    return model


def build_low_mem_model():
    """The inline-cache model initialised directly in bf16 (``low_cpu_mem_usage``)."""
    torch.manual_seed(0)
    cfg = load_cfg(overrides={"bf16": True, "low_cpu_mem_usage": True, "kda": {"layout": "inline"}})
    model = load_model(cfg)
    greedy_steps(model, torch.tensor([6, 2]), torch.tensor([0, 1], dtype=torch.int32), num_steps=2)
    return model


def build_pooled_model():
    """One cache pool for both layers, with scratch rows for two speculative tokens."""
    torch.manual_seed(0)
    cfg = load_cfg(overrides={"bf16": True, "kda": {"layout": "pool", "speculative_tokens": 2}})
    model = load_model(cfg)
    greedy_steps(model, torch.tensor([4, 4]), torch.tensor([1, 2], dtype=torch.int32), num_steps=2)
    pool = model.model.kda_pool
    pool.stage_draft(0, slot=1)
    return {"model": model, "pool": pool}


def build_merged_model():
    """Inline-cache bf16 model with a LoRA adapter merged into layer 0's query projection."""
    torch.manual_seed(0)
    cfg = load_cfg(overrides={"bf16": True, "kda": {"layout": "inline"}})
    hidden, key_dim = cfg.hidden_size, cfg.kda.num_heads * cfg.kda.head_k_dim
    adapter = {"model.layers.0.self_attn.q_proj": (torch.randn(cfg.lora_r, hidden), torch.randn(key_dim, cfg.lora_r))}
    model = load_model(cfg)
    slots = torch.tensor([0, 1], dtype=torch.int32)
    greedy_steps(model, torch.tensor([7, 3]), slots)
    model, snapshot = load_merged_model(cfg, adapter=adapter, model=model)
    greedy_steps(model, torch.tensor([2, 2]), slots)
    return {"model": model, "snapshot": snapshot}
