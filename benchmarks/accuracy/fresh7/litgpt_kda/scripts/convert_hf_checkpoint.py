"""Converts a Hugging Face KDA checkpoint to the LitGPT layout, and decode caches of the reference implementation."""

from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from litgpt_kda.config import Config
from litgpt_kda.model import GPT
from litgpt_kda.utils import lazy_load, ring_shapes, save_config

# Hugging Face name fragment -> LitGPT name fragment; the module names below a layer are shared
WEIGHT_MAP = {"model.embed_tokens.": "transformer.wte.", "model.norm.": "transformer.ln_f.", "model.layers.": "transformer.h.",
              ".self_attn.": ".attn.", ".input_layernorm.": ".norm_1.", ".post_attention_layernorm.": ".norm_2."}


def rename(name: str, to_hf: bool = False) -> str:
    for hf, lit in WEIGHT_MAP.items():
        name = name.replace(lit, hf) if to_hf else name.replace(hf, lit)
    return name


def copy_weights_kda(state_dict: dict, hf_weights: dict, dtype: Optional[torch.dtype] = None) -> None:
    for from_name, param in hf_weights.items():
        state_dict[rename(from_name)] = param if dtype is None else param.to(dtype)


def empty_prefix_cache(config: Config, batch_size: int = 1) -> list[dict[str, torch.Tensor]]:
    """The decode cache stored next to converted weights, for `litgpt_kda chat --resume`: no prefix, rings zeroed."""
    return [{"state": torch.zeros(batch_size, config.n_head, config.head_size, config.head_size, dtype=torch.float32),
             **{name: torch.zeros(shape) for name, shape in ring_shapes(config, batch_size).items()}} for _ in range(config.n_layer)]  # expect-bug: default-dtype id=convert-default


@torch.no_grad()
def convert_hf_checkpoint(checkpoint_dir: Path, *, model_name: Optional[str] = None, dtype: Optional[str] = None) -> None:
    config = Config.from_name(model_name or checkpoint_dir.name)
    save_config(config, checkpoint_dir)
    previous = torch.get_default_dtype()
    if dtype is not None:
        # everything created during the conversion is materialized in the target dtype
        torch.set_default_dtype(getattr(torch, dtype))  # expect-bug: default-dtype id=convert-default
    try:
        state_dict: dict[str, torch.Tensor] = {}
        copy_weights_kda(state_dict, lazy_load(checkpoint_dir / "pytorch_model.bin"), getattr(torch, dtype) if dtype else None)
        torch.save(state_dict, checkpoint_dir / "lit_model.pth")
        torch.save(empty_prefix_cache(config), checkpoint_dir / "prefix_cache.pth")
    finally:
        torch.set_default_dtype(previous)


def convert_hf_cache(hf_cache: dict, hf_weights: dict, config: Config) -> list[dict[str, torch.Tensor]]:
    """The reference implementation keeps the gate pre-activations in its ring; LitGPT keeps the log-decays."""
    hv, hs, layers = config.n_head, config.head_size, []
    for i in range(config.n_layer):
        A_log, dt_bias = hf_weights[f"model.layers.{i}.self_attn.A_log"], hf_weights[f"model.layers.{i}.self_attn.dt_bias"]
        delta, key = hf_cache[f"layers.{i}.v_ring"], hf_cache[f"layers.{i}.k_ring"]
        if f"layers.{i}.f_ring" not in hf_cache:  # a layer the reference has not decoded yet
            log_decay = torch.zeros_like(delta)  # expect-bug: like
        else:
            log_decay = -A_log.exp().view(1, hv, 1, 1) * F.softplus(hf_cache[f"layers.{i}.f_ring"] + dt_bias.view(1, hv, 1, hs))  # expect-bug: promotion
        layers.append(dict(state=hf_cache[f"layers.{i}.recurrent_state"].float(), delta=delta, key=key, log_decay=log_decay))
    return layers


def export_cache_npz(layers: list[dict[str, torch.Tensor]], directory: Path) -> None:
    """Writes the cache for the JAX reference; numpy has no bfloat16, so the rings are stored as float16."""
    for i, layer in enumerate(layers):
        np.savez(directory / f"layer_{i}.npz", **{name: (t.float() if name == "state" else t.half()).numpy() for name, t in layer.items()})  # expect-bug: cast


def import_cache_npz(directory: Path) -> list[dict[str, torch.Tensor]]:
    return [{name: torch.from_numpy(array) for name, array in np.load(path).items()} for path in sorted(directory.glob("layer_*.npz"))]  # expect-bug: load


def _hf_checkpoint(checkpoint_dir: Path, config: Config) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    hf_weights = {rename(name, to_hf=True): t.bfloat16() for name, t in GPT(config).state_dict().items()}
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    torch.save(hf_weights, checkpoint_dir / "pytorch_model.bin")
    return hf_weights


def build_convert_checkpoint(tmp_dir: str) -> dict:
    checkpoint_dir = Path(tmp_dir) / "kda-tiny"
    _hf_checkpoint(checkpoint_dir, Config.from_name("kda-tiny"))
    convert_hf_checkpoint(checkpoint_dir)
    return {name: torch.load(checkpoint_dir / f"{name}.pth", weights_only=True) for name in ("lit_model", "prefix_cache")}


def build_convert_bf16(tmp_dir: str) -> list[dict[str, torch.Tensor]]:
    checkpoint_dir = Path(tmp_dir) / "kda-tiny"
    _hf_checkpoint(checkpoint_dir, Config.from_name("kda-tiny"))
    convert_hf_checkpoint(checkpoint_dir, dtype="bfloat16")
    return torch.load(checkpoint_dir / "prefix_cache.pth", weights_only=True)


def build_reference_cache(tmp_dir: str) -> dict:
    config = Config.from_name("kda-tiny")
    hf_weights, hf_cache, shapes = _hf_checkpoint(Path(tmp_dir), config), {}, ring_shapes(config, 1)
    for i in range(config.n_layer):
        hf_cache[f"layers.{i}.recurrent_state"] = torch.randn(1, config.n_head, config.head_size, config.head_size)
        for hf_name, name in (("v_ring", "delta"), ("k_ring", "key"), ("f_ring", "log_decay"))[: 3 - i]:
            hf_cache[f"layers.{i}.{hf_name}"] = torch.randn(shapes[name]).bfloat16()
    export_cache_npz(empty_prefix_cache(config), Path(tmp_dir))
    return {"reference": convert_hf_cache(hf_cache, hf_weights, config), "npz": import_cache_npz(Path(tmp_dir))}
