"""Adapter state dicts, adapter files and replay-cache files."""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, Mapping, Optional

import torch
from torch import nn

from .constants import REPLAY_CACHE_FORMAT, SAFETENSORS_WEIGHTS_NAME, WEIGHTS_NAME
from .other import iter_replay_caches

try:
    from safetensors.torch import load_file as safe_load_file
    from safetensors.torch import save_file as safe_save_file
except ImportError:  # safetensors is optional: fall back to torch pickles
    safe_load_file = None
    safe_save_file = None


def is_safetensors_available() -> bool:
    return safe_save_file is not None


def get_peft_model_state_dict(
    model: nn.Module, state_dict: Optional[Mapping[str, torch.Tensor]] = None, adapter_name: str = "default"
) -> Dict[str, torch.Tensor]:
    """The adapter weights of ``adapter_name`` (and its ``modules_to_save`` copies), without the
    adapter name in the keys."""
    if state_dict is None:
        state_dict = model.state_dict()
    to_return = {k: v for k, v in state_dict.items() if "lora_" in k and f".{adapter_name}." in k}
    for module_name in getattr(model, "modules_to_save", None) or ():
        marker = f"{module_name}.modules_to_save.{adapter_name}."
        for key, value in state_dict.items():
            if marker in key:
                to_return[key.replace(f"modules_to_save.{adapter_name}.", "")] = value
    return {k.replace(f".{adapter_name}.", "."): v for k, v in to_return.items()}


def set_peft_model_state_dict(
    model: nn.Module,
    peft_model_state_dict: Mapping[str, torch.Tensor],
    adapter_name: str = "default",
    low_cpu_mem_usage: bool = False,
):
    """Loads adapter weights saved by :func:`get_peft_model_state_dict` under ``adapter_name``."""
    modules_to_save = getattr(model, "modules_to_save", None) or ()
    state_dict: Dict[str, torch.Tensor] = {}
    for key, value in peft_model_state_dict.items():
        for module_name in modules_to_save:
            if f"{module_name}." in key and "lora_" not in key:
                key = key.replace(f"{module_name}.", f"{module_name}.modules_to_save.{adapter_name}.", 1)
                break
        if "lora_" in key:
            head, _, leaf = key.rpartition(".")
            key = f"{head}.{adapter_name}.{leaf}"
        state_dict[key] = value
    # with low_cpu_mem_usage the loaded tensors are used as they are, without a copy
    return model.load_state_dict(state_dict, strict=False, assign=low_cpu_mem_usage)


def load_peft_weights(model_id: str, device: Optional[str] = None, torch_dtype: Optional[torch.dtype] = None) -> Dict[str, torch.Tensor]:
    """Reads the adapter weights in the directory ``model_id`` (safetensors first)."""
    safe_path = os.path.join(model_id, SAFETENSORS_WEIGHTS_NAME)
    pickle_path = os.path.join(model_id, WEIGHTS_NAME)
    if os.path.exists(safe_path) and safe_load_file is not None:
        adapters_weights = safe_load_file(safe_path, device=device or "cpu")
    elif os.path.exists(pickle_path):
        adapters_weights = torch.load(pickle_path, map_location=device or "cpu", weights_only=True)
    else:
        raise ValueError(f"Can't find weights for {model_id}: neither {SAFETENSORS_WEIGHTS_NAME} nor {WEIGHTS_NAME} is there.")
    if torch_dtype is not None:
        adapters_weights = {k: v.to(torch_dtype) if v.is_floating_point() else v for k, v in adapters_weights.items()}
    return adapters_weights


def save_adapter_weights(state_dict: Mapping[str, torch.Tensor], output_dir: str, safe_serialization: bool = True) -> str:
    if safe_serialization and is_safetensors_available():
        path = os.path.join(output_dir, SAFETENSORS_WEIGHTS_NAME)
        safe_save_file({k: v.contiguous() for k, v in state_dict.items()}, path, metadata={"format": "pt"})
    else:
        path = os.path.join(output_dir, WEIGHTS_NAME)
        torch.save(dict(state_dict), path)
    return path


# --- replay caches ---------------------------------------------------------------------------


def get_replay_cache_state_dict(model: nn.Module) -> Dict[str, torch.Tensor]:
    """Every replay-cache buffer of ``model``, keyed ``<cache module>.<buffer>`` (copies)."""
    return {
        f"{name}.{buffer_name}": buf.detach().clone()
        for name, cache in iter_replay_caches(model)
        for buffer_name, buf in cache.named_buffers(recurse=False)
    }


def set_replay_cache_state_dict(
    model: nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    torch_dtype: Optional[torch.dtype] = None,
    low_cpu_mem_usage: bool = False,
) -> None:
    """Restores replay-cache buffers saved by :func:`get_replay_cache_state_dict`.

    By default the rows are copied into the caches ``model`` already has (their dtypes win). With
    ``low_cpu_mem_usage`` the loaded tensors replace the buffers, in ``torch_dtype`` when given.
    """
    for key, tensor in state_dict.items():
        module_name, _, buffer_name = key.rpartition(".")
        try:
            cache = model.get_submodule(module_name)
        except AttributeError:
            warnings.warn(f"{module_name} is not a module of the model; its replay cache is not restored")
            continue
        if low_cpu_mem_usage:
            if torch_dtype is not None and tensor.is_floating_point() and buffer_name != "recurrent_state":
                tensor = tensor.to(torch_dtype)  # expect-bug: load
            cache._buffers[buffer_name] = tensor
        else:
            cache._buffers[buffer_name].copy_(tensor)


def save_replay_cache_file(tensors: Mapping[str, torch.Tensor], path: str) -> None:
    """Writes replay-cache tensors in the current format (runtime state, so a torch pickle)."""
    torch.save({"format": REPLAY_CACHE_FORMAT, "tensors": {k: v.contiguous() for k, v in tensors.items()}}, path)


def load_replay_cache_file(path: str, head_k_dim: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """Reads a file written by :func:`save_replay_cache_file`; older formats are upgraded."""
    payload: Dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    tensors = dict(payload["tensors"])
    if int(payload.get("format", 1)) < 2:
        tensors = _upgrade_per_head_gates(tensors, head_k_dim)
    return tensors


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _upgrade_per_head_gates(tensors: Mapping[str, torch.Tensor], head_k_dim: Optional[int]) -> Dict[str, torch.Tensor]:
    """Format 1 -> 2: a per-head ``gate_ring [slots, HV, L]`` becomes a per-channel
    ``log_decay_ring [slots, HV, L, K]`` (the same decay on every key channel)."""
    upgraded: Dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        prefix, _, name = key.rpartition(".")
        if name != "gate_ring":
            upgraded[key] = tensor
            continue
        delta_ring = tensors[_join(prefix, "delta_ring")]
        width = head_k_dim or tensors[_join(prefix, "key_ring")].shape[-1]
        log_decay_ring = delta_ring.new_zeros(*tensor.shape, width)  # expect-bug: like
        log_decay_ring.copy_(tensor.unsqueeze(-1).expand_as(log_decay_ring))
        upgraded[_join(prefix, "log_decay_ring")] = log_decay_ring
    return upgraded


def build_legacy_replay_snapshot(tmp_dir: str) -> Dict[str, Any]:
    """A warm cache saved in format 1 (per-head decays), restored into a bf16 model and decoded on."""
    from ..modeling_kda import KdaConfig, KdaForCausalLM

    torch.manual_seed(0)
    config = KdaConfig()
    hv, h, k, v, ring = config.num_v_heads, config.num_heads, config.head_k_dim, config.head_v_dim, config.ring_len
    legacy = {}
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}.self_attn.replay_cache"
        legacy[f"{prefix}.recurrent_state"] = torch.randn(2, hv, v, k) * 0.1
        legacy[f"{prefix}.delta_ring"] = (torch.randn(2, hv, ring, v) * 0.1).to(torch.bfloat16)
        legacy[f"{prefix}.key_ring"] = torch.nn.functional.normalize(torch.randn(2, h, ring, k), dim=-1).to(torch.bfloat16)
        legacy[f"{prefix}.gate_ring"] = -torch.rand(2, hv, ring) * 0.5
        legacy[f"{prefix}.write_pos"] = torch.tensor([2, 1], dtype=torch.int32)
    path = os.path.join(tmp_dir, "replay_cache.bin")
    torch.save({"format": 1, "tensors": legacy}, path)

    model = KdaForCausalLM(config).to(torch.bfloat16)
    model.enable_replay_cache(2)
    set_replay_cache_state_dict(model, load_replay_cache_file(path), low_cpu_mem_usage=True)
    tokens = model.generate(torch.tensor([[5], [7]]), max_new_tokens=3)
    return {"caches": model.replay_caches(), "tokens": tokens}
