"""Rule-driven operator injection and GGUF loading.

A rule list is what KTransformers keeps in its optimisation YAML files: each rule matches modules
by a regex on their HF name (and optionally by class) and either replaces them with an injected
operator class or keeps them (``"default"``) on a given device. ``optimize_and_load_gguf`` applies
the rules to a model built on the meta device and then loads every weight from a GGUF archive.
"""

from __future__ import annotations

import copy
import importlib
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from ..compat import get_logger, init_empty_weights
from ..models.configuration_kimi_linear import KDACacheSpec, KimiLinearConfig
from ..models.custom_cache import KDAStaticCache
from ..models.modeling_kimi_linear import KimiLinearForCausalLM
from ..operators.kda import random_decode_batch
from ..util.custom_gguf import (
    GGML_NAME_TO_TORCH,
    GGML_TYPE_BF16,
    DiskPrefixStore,
    GGUFLoader,
    write_gguf_from_state_dict,
)
from ..util.utils import load_weights, set_module

logger = get_logger(__name__)

DEFAULT_OPTIMIZE_RULES: list[dict[str, Any]] = [
    {
        "match": {
            "name": r"^model\.layers\.\d+\.self_attn$",
            "class": "..models.modeling_kimi_linear.KimiDeltaAttention",
        },
        "replace": {
            "class": "..operators.kda.KKimiDeltaAttention",
            "kwargs": {"generate_device": "cpu", "prefill_device": "cpu", "ring_buffers": "cache"},
        },
    },
    {
        "match": {"name": r"^lm_head$"},
        "replace": {"class": "default", "kwargs": {"generate_device": "cpu", "prefill_device": "cpu"}},
        "recursive": False,
    },
    {
        "match": {"name": r"^model\.embed_tokens$"},
        "replace": {"class": "default", "kwargs": {"generate_device": "cpu", "prefill_device": "cpu"}},
    },
]

TORCH_RING_RULES: list[dict[str, Any]] = copy.deepcopy(DEFAULT_OPTIMIZE_RULES)
TORCH_RING_RULES[0]["replace"]["kwargs"]["ring_buffers"] = "torch"


def _resolve(path: str) -> type:
    module_path, _, class_name = path.rpartition(".")
    return getattr(importlib.import_module(module_path, package=__package__), class_name)


def gen_optimize_config(
    module: nn.Module, out_data: dict, rule_list: list[dict], prefix: str = "", default_device: str = "cpu"
) -> None:
    module_name = prefix[:-1]
    recursive = True
    for rule in rule_list:
        match = rule["match"]
        if "class" in match and not isinstance(module, _resolve(match["class"])):
            continue
        if "name" in match and re.search(match["name"], module_name) is None:
            continue
        if "replace" in rule:
            replace = rule["replace"]
            kwargs = {"generate_device": default_device, "prefill_device": default_device}
            kwargs.update(replace.get("kwargs", {}))
            out_data[module_name] = {"key": module_name, "class": replace.get("class", "default"), "kwargs": kwargs}
        recursive = rule.get("recursive", True)
        break
    if module_name not in out_data:
        out_data[module_name] = {
            "key": module_name,
            "class": "default",
            "kwargs": {"generate_device": default_device, "prefill_device": default_device},
        }
    if recursive:
        for name, child in module._modules.items():
            if child is not None:
                gen_optimize_config(child, out_data, rule_list, prefix + name + ".", default_device)


def inject(
    module: nn.Module, local_optimization_dict: dict, model_config: KimiLinearConfig, gguf_loader, prefix: str = ""
) -> None:
    for name, child in list(module._modules.items()):
        if child is None:
            continue
        child_prefix = prefix + name
        item = local_optimization_dict.get(child_prefix)
        if item is not None and item["class"] != "default":
            module_cls = _resolve(item["class"])
            injected = module_cls(
                key=item["key"], gguf_loader=gguf_loader, config=model_config, orig_module=child, **item["kwargs"]
            )
            set_module(module, name, injected)
            logger.info("injected %s as %s", child_prefix, module_cls.__name__)
        else:
            inject(child, local_optimization_dict, model_config, gguf_loader, child_prefix + ".")


def optimize_and_load_gguf(
    module: nn.Module, rule_list: list[dict], gguf_loader: GGUFLoader, model_config: KimiLinearConfig,
    default_device: str = "cpu",
) -> nn.Module:
    optimize_config: dict[str, dict] = {}
    gen_optimize_config(module, optimize_config, rule_list, default_device=default_device)
    with torch.device("meta"):
        inject(module, optimize_config, model_config, gguf_loader)
    load_weights(module, gguf_loader, device=default_device)
    module.gguf_loader = gguf_loader
    return module


def cache_spec_from_gguf(gguf_loader: GGUFLoader) -> KDACacheSpec:
    """Cache dtypes for a GGUF model: rings follow the archive's file type, or the SSM cache type it declares."""
    meta = gguf_loader.gguf_file_meta
    ring_dtype = GGML_NAME_TO_TORCH[meta["general.file_type"]]
    alpha_log_dtype = GGML_NAME_TO_TORCH[meta.get("kimi_linear.ssm_cache_type", meta["general.file_type"])]  # expect-bug: imported-policy
    return KDACacheSpec(ring_dtype, ring_dtype, ring_dtype, alpha_log_dtype)


@dataclass
class ChatSession:
    """Recurrent state of one conversation between turns (one slot, every layer)."""

    ssm_states: list[torch.Tensor]
    delta: list[torch.Tensor]
    key: list[torch.Tensor]
    alpha_log: list[torch.Tensor]
    write_pos: torch.Tensor
    tokens: list[int] = field(default_factory=list)


def new_chat_session(config: KimiLinearConfig, dtype: Optional[torch.dtype] = None) -> ChatSession:
    """An empty session; state, delta and key rows in ``dtype`` (default: torch's default dtype)."""
    dtype = dtype or torch.get_default_dtype()
    shapes = config.ring_shapes(1)
    layers = range(config.num_hidden_layers)
    ssm_states = [torch.zeros(shapes["state"], dtype=dtype) for _ in layers]
    delta = [torch.zeros(shapes["delta"], dtype=dtype) for _ in layers]
    key = [torch.zeros(shapes["key"], dtype=dtype) for _ in layers]
    alpha_log = [torch.zeros(shapes["alpha_log"]) for _ in layers]  # expect-bug: default-dtype id=chat-default
    return ChatSession(ssm_states, delta, key, alpha_log, torch.zeros(1, dtype=torch.int32))


def capture_session(session: ChatSession, layer_rings: list[tuple[torch.Tensor, ...]], write_pos, slot: int) -> None:
    """Copies the rows of ``slot`` (state, delta, key, log-decay per layer) into ``session``."""
    for layer_idx, rings in enumerate(layer_rings):
        targets = (session.ssm_states, session.delta, session.key, session.alpha_log)
        for target, ring in zip(targets, rings):
            target[layer_idx].copy_(ring[slot : slot + 1])
    session.write_pos.copy_(write_pos[slot : slot + 1])


def save_chat_session(path: str, session: ChatSession) -> None:
    """Writes the portable F16 session format (``.npz``; numpy has no bfloat16)."""
    arrays = {"write_pos": session.write_pos.numpy(), "tokens": np.asarray(session.tokens, dtype=np.int64)}
    for layer_idx in range(len(session.alpha_log)):
        for kind, rings in (("state", session.ssm_states), ("delta", session.delta), ("key", session.key), ("alpha_log", session.alpha_log)):
            arrays[f"{kind}.{layer_idx}"] = rings[layer_idx].to(torch.float16).numpy()
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


def load_chat_session(path: str, config: KimiLinearConfig) -> ChatSession:
    dtype = config.model_torch_dtype
    layers = range(config.num_hidden_layers)
    with np.load(path) as archive:
        ssm_states = [torch.from_numpy(archive[f"state.{i}"]).to(dtype) for i in layers]
        delta = [torch.from_numpy(archive[f"delta.{i}"]).to(dtype) for i in layers]
        key = [torch.from_numpy(archive[f"key.{i}"]).to(dtype) for i in layers]
        alpha_log = [torch.from_numpy(archive[f"alpha_log.{i}"]) for i in layers]  # expect-bug: load
        write_pos = torch.from_numpy(archive["write_pos"]).to(torch.int32)
        tokens = archive["tokens"].tolist()
    return ChatSession(ssm_states, delta, key, alpha_log, write_pos, tokens)


def _model_rings(model: KimiLinearForCausalLM) -> list[tuple[torch.Tensor, ...]]:
    rings = []
    for layer in model.model.layers:
        ring_module = layer.self_attn.rings
        rings.append((ring_module.state, ring_module.delta_ring, ring_module.key_ring, ring_module.alpha_log_ring))
    return rings


def _cache_rings(cache: KDAStaticCache) -> list[tuple[torch.Tensor, ...]]:
    return [
        (cache.ssm_states[i], cache.delta_cache[i], cache.key_cache[i], cache.alpha_log_cache[i])
        for i in range(cache.config.num_hidden_layers)
    ]


def decode_tokens(model, input_ids, steps, slot_ids, cache=None) -> list[int]:
    """Greedy decode of ``steps`` tokens for every row; returns the tokens of row 0."""
    generated = []
    for _ in range(steps):
        logits = model(input_ids, cache=cache, slot_ids=slot_ids)
        if cache is not None:
            cache.advance(slot_ids)
        input_ids = logits.argmax(-1)
        generated.append(int(input_ids[0]))
    return generated


def _write_reference_gguf(tmp_dir: str, config: KimiLinearConfig, seed: int) -> str:
    torch.manual_seed(seed)
    reference = KimiLinearForCausalLM(config)
    path = os.path.join(tmp_dir, f"kimi-linear-{seed}.gguf")
    write_gguf_from_state_dict(path, reference.state_dict(), GGML_TYPE_BF16)
    return path


def local_chat(
    config: KimiLinearConfig, gguf_path: str, prompt_ids: list[int], max_new_tokens: int = 3,
    ring_buffers: str = "cache",
) -> dict[str, Any]:
    """Loads the model with the rule set for ``ring_buffers`` and decodes one conversation turn."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(config.model_torch_dtype)  # expect-bug: default-dtype id=chat-default
    try:
        gguf_loader = GGUFLoader(gguf_path)
        rules = DEFAULT_OPTIMIZE_RULES if ring_buffers == "cache" else TORCH_RING_RULES
        with init_empty_weights():
            model = KimiLinearForCausalLM(config)
        optimize_and_load_gguf(model, rules, gguf_loader, config)
        model.to(config.model_torch_dtype)  # expect-bug: module-cast
        cache = KDAStaticCache(config, max_batch_size=1, spec=cache_spec_from_gguf(gguf_loader)) if ring_buffers == "cache" else None
        slot_ids = torch.zeros(1, dtype=torch.int32)
        for token in prompt_ids[:-1]:
            model(torch.tensor([token]), cache=cache, slot_ids=slot_ids)
            if cache is not None:
                cache.advance(slot_ids)
        generated = decode_tokens(model, torch.tensor(prompt_ids[-1:]), max_new_tokens, slot_ids, cache)
        session = new_chat_session(config)
        if cache is not None:
            capture_session(session, _cache_rings(cache), cache.write_pos, slot=0)
        else:
            capture_session(session, _model_rings(model), model.model.layers[0].self_attn.rings.write_pos, slot=0)
        session.tokens = [*prompt_ids, *generated]
    finally:
        torch.set_default_dtype(previous)
    return {"model": model, "cache": cache, "session": session}


def build_optimized_model(tmp_dir: str):
    """The default rule set on a meta-built model loaded from GGUF, decoding two rows through a cache."""
    config = KimiLinearConfig()
    gguf_loader = GGUFLoader(_write_reference_gguf(tmp_dir, config, seed=41))
    torch.manual_seed(41)
    with init_empty_weights():
        model = KimiLinearForCausalLM(config)
    optimize_and_load_gguf(model, DEFAULT_OPTIMIZE_RULES, gguf_loader, config)
    model.to("cpu")
    cache = KDAStaticCache(config, spec=KDACacheSpec.from_config(config))
    slot_ids = torch.tensor([0, 2], dtype=torch.int32)
    decode_tokens(model, torch.tensor([3, 7]), 3, slot_ids, cache)
    torch_model = KimiLinearForCausalLM(config)
    optimize_and_load_gguf(torch_model, TORCH_RING_RULES, gguf_loader, config)
    torch_model.to(device="cpu")
    decode_tokens(torch_model, torch.tensor([5, 1]), 2, torch.tensor([1, 0], dtype=torch.int32))
    return {"model": model, "cache": cache, "torch_model": torch_model}


def build_local_chat(tmp_dir: str):
    """One chat turn with the cache rule set and one with the torch ring rule set."""
    config = KimiLinearConfig()
    gguf_path = _write_reference_gguf(tmp_dir, config, seed=42)
    torch.manual_seed(42)
    cached = local_chat(config, gguf_path, [1, 4, 9], max_new_tokens=2, ring_buffers="cache")
    standalone = local_chat(config, gguf_path, [2, 6], max_new_tokens=2, ring_buffers="torch")
    return {"cached": cached, "standalone": standalone}


def build_session_restore(tmp_dir: str):
    """A session saved and loaded, a prefix adopted from disk and two slots exported for migration."""
    torch.manual_seed(43)
    config = KimiLinearConfig(num_hidden_layers=1)
    cache = KDAStaticCache(config, max_batch_size=2)
    slot_ids = torch.tensor([0, 1], dtype=torch.int32)
    for _ in range(2):
        cache.step(0, slot_ids=slot_ids, **random_decode_batch(config, 2, config.model_torch_dtype))
        cache.advance(slot_ids)

    session = new_chat_session(config, dtype=config.model_torch_dtype)
    capture_session(session, _cache_rings(cache), cache.write_pos, slot=1)
    path = os.path.join(tmp_dir, "session.npz")
    save_chat_session(path, session)
    restored = load_chat_session(path, config)

    store = DiskPrefixStore(os.path.join(tmp_dir, "prefix"))
    cache.write_prefix(store, "turn0")
    adopted = KDAStaticCache(config, max_batch_size=1)
    adopted.adopt_prefix(store, "turn0")

    payload = cache.export_slots(slot_ids)
    target = KDAStaticCache(config, max_batch_size=2)
    target.import_slots(payload, slot_ids.flip(0))
    return {"session": session, "restored": restored, "adopted": adopted, "payload": payload, "target": target}
