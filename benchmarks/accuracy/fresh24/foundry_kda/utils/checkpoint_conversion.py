# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Composer checkpoint -> Hugging Face-style checkpoint, and decode-cache handoff files.

The files are numpy ``.npz`` archives (safetensors-like: flat ``name -> array`` plus a dtype
manifest, since numpy has no bfloat16). Run as a script::

    python -m foundry_kda.utils.checkpoint_conversion \\
        --composer_path ep1-ba1000-rank0.pt --hf_output_path ./hf --output_precision bf16
"""

from __future__ import annotations

import argparse
import io
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import nn

from foundry_kda.inference.cache_pool import (
    TINY_REPLAY_SPEC,
    ReplayCachePool,
    StaticReplayCache,
    randomize_,
)
from foundry_kda.models.kda_attention import ReplaySpec
from foundry_kda.models.kimi_linear import KimiLinearConfig, KimiLinearForCausalLM
from foundry_kda.precision import ring_dtypes_for
from foundry_kda.utils import dist
from foundry_kda.utils.config_utils import dtype_from_str

__all__ = [
    "convert_composer_to_hf",
    "export_decode_cache",
    "get_composer_key",
    "get_hf_key",
    "load_decode_cache",
    "load_numpy_checkpoint",
    "save_numpy_checkpoint",
]

_MANIFEST = "__dtypes__"
#: Tensors that are exported in float32 whatever ``torch_dtype`` is: the decay parameters and
#: the replay caches' checkpoints and log-decay rings.
_KEEP_FP32_SUFFIXES = ("A_log", "dt_bias", ".replay.state", ".replay.g_cache")

_TO_HF = [
    (re.compile(r"^blocks\.(\d+)\.attn\."), r"model.layers.\1.self_attn."),
    (re.compile(r"^blocks\.(\d+)\.attn_norm\."), r"model.layers.\1.input_layernorm."),
    (re.compile(r"^blocks\.(\d+)\.mlp_norm\."), r"model.layers.\1.post_attention_layernorm."),
    (re.compile(r"^blocks\.(\d+)\.mlp\."), r"model.layers.\1.mlp."),
    (re.compile(r"^decode_cache\.(\d+)\."), r"model.layers.\1.self_attn.replay."),
    (re.compile(r"^embed_tokens\."), r"model.embed_tokens."),
    (re.compile(r"^norm\."), r"model.norm."),
]
_TO_COMPOSER = [
    (re.compile(r"^model\.layers\.(\d+)\.self_attn\.replay\."), r"decode_cache.\1."),
    (re.compile(r"^model\.layers\.(\d+)\.self_attn\."), r"blocks.\1.attn."),
    (re.compile(r"^model\.layers\.(\d+)\.input_layernorm\."), r"blocks.\1.attn_norm."),
    (re.compile(r"^model\.layers\.(\d+)\.post_attention_layernorm\."), r"blocks.\1.mlp_norm."),
    (re.compile(r"^model\.layers\.(\d+)\.mlp\."), r"blocks.\1.mlp."),
    (re.compile(r"^model\.embed_tokens\."), r"embed_tokens."),
    (re.compile(r"^model\.norm\."), r"norm."),
]


def _rename(key: str, rules: Sequence[tuple[re.Pattern[str], str]]) -> str:
    for pattern, replacement in rules:
        if pattern.match(key):
            return pattern.sub(replacement, key, count=1)
    return key


def get_hf_key(composer_key: str) -> str:
    return _rename(composer_key.removeprefix("model."), _TO_HF)


def get_composer_key(hf_key: str) -> str:
    return _rename(hf_key, _TO_COMPOSER)


def convert_composer_to_hf(
    composer_state: Mapping[str, Any], torch_dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """The model weights of a Composer checkpoint under Hugging Face names, cast to ``torch_dtype``.

    Eval-only buffers (``eval_cache``) are dropped; see :data:`_KEEP_FP32_SUFFIXES` for what
    stays float32.
    """
    model_state = composer_state["state"]["model"] if "state" in composer_state else composer_state
    hf_state: dict[str, torch.Tensor] = {}
    for key, tensor in model_state.items():
        if key.startswith("eval_cache.") or ".eval_cache." in key:
            continue
        hf_key = get_hf_key(key)
        if tensor.is_floating_point() and not hf_key.endswith(_KEEP_FP32_SUFFIXES):
            tensor = tensor.to(torch_dtype)
        hf_state[hf_key] = tensor.detach().clone()
    return hf_state


def save_numpy_checkpoint(tensors: Mapping[str, torch.Tensor], f: str | Path | IO[bytes]) -> None:
    """Writes ``tensors`` as an ``.npz`` archive; bf16 tensors are stored as their bits."""
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        dtypes[name] = str(tensor.dtype).removeprefix("torch.")
        arrays[name] = tensor.view(torch.int16).numpy() if tensor.dtype == torch.bfloat16 else tensor.numpy()
    arrays[_MANIFEST] = np.array(json.dumps(dtypes))
    np.savez(f, **arrays)


def load_numpy_checkpoint(f: str | Path | IO[bytes]) -> dict[str, torch.Tensor]:
    """Reads an archive written by :func:`save_numpy_checkpoint`, dtypes restored."""
    with np.load(f) as archive:
        dtypes = json.loads(str(archive[_MANIFEST]))
        tensors = {}
        for name, dtype in dtypes.items():
            tensor = torch.from_numpy(archive[name].copy())
            tensors[name] = tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor
    return tensors


def export_decode_cache(pool: ReplayCachePool, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The caches of a serving pool as flat tensors, for handoff to another serving process.

    The handoff format is numpy-native, so ``dtype`` is float32 or float16.
    """
    if dtype not in (torch.float32, torch.float16):
        raise ValueError(f"decode caches are handed off in float32 or float16, not {dtype}")
    tensors: dict[str, torch.Tensor] = {}
    for i, rings in enumerate(pool.layers):
        prefix = f"decode_cache.{i}"
        tensors[f"{prefix}.state"] = rings.state.float().clone()
        tensors[f"{prefix}.d_cache"] = rings.d_cache.to(dtype, copy=True)
        tensors[f"{prefix}.k_cache"] = rings.k_cache.to(dtype, copy=True)
        tensors[f"{prefix}.g_cache"] = rings.g_cache.to(dtype=dtype, copy=True)  # expect-bug: cast
        tensors[f"{prefix}.write_pos"] = rings.write_pos.clone()
    return tensors


_NUMPY_DTYPES = {torch.float32: np.float32, torch.float16: np.float16}


def load_decode_cache(
    f: str | Path | IO[bytes], spec: ReplaySpec, dtype: torch.dtype = torch.float16
) -> nn.ModuleList:
    """Reads a handoff archive into one :class:`StaticReplayCache` per layer (rings in ``dtype``)."""
    np_dtype = _NUMPY_DTYPES[dtype]
    caches = nn.ModuleList()
    with np.load(f) as archive:
        for i in range(spec.num_layers):
            prefix = f"decode_cache.{i}"
            num_slots, _, ring_len, _ = archive[f"{prefix}.d_cache"].shape
            cache = StaticReplayCache(spec, num_slots, ring_len, dtype=dtype)
            cache.state.copy_(torch.from_numpy(archive[f"{prefix}.state"]))
            cache.d_cache = torch.from_numpy(archive[f"{prefix}.d_cache"].astype(np_dtype))
            cache.k_cache = torch.from_numpy(archive[f"{prefix}.k_cache"].astype(np_dtype))
            cache.log_decay_ring = torch.from_numpy(archive[f"{prefix}.g_cache"].astype(np_dtype))  # expect-bug: load
            cache.write_pos.copy_(torch.from_numpy(archive[f"{prefix}.write_pos"]))
            caches.append(cache)
    return caches


def _composer_state(model: nn.Module) -> dict[str, Any]:
    """``model`` in the layout of a Composer checkpoint (``state.model`` of the wrapper)."""
    return {"state": {"model": {f"model.{k}": v for k, v in model.state_dict().items()}}}


def build_hf_export_keep_fp32_gates() -> dict[str, object]:
    """bf16 HF export of a model with decode caches, written, read back and loaded."""
    torch.manual_seed(0)
    model = KimiLinearForCausalLM(KimiLinearConfig())
    model.allocate_decode_cache(num_slots=2, ring_len=4)
    for tokens in ([1, 2], [3, 4], [5, 6]):
        model.decode_step(torch.tensor(tokens), torch.tensor([0, 1]))
    hf_state = convert_composer_to_hf(_composer_state(model), torch.bfloat16)
    buffer = io.BytesIO()
    save_numpy_checkpoint(hf_state, buffer)
    buffer.seek(0)
    reloaded = KimiLinearForCausalLM(KimiLinearConfig())
    reloaded.allocate_decode_cache(num_slots=2, ring_len=4)
    reloaded.load_state_dict({get_composer_key(k): v for k, v in load_numpy_checkpoint(buffer).items()})
    reloaded.to(torch.bfloat16)
    return {"hf_state": hf_state, "reloaded": reloaded}


def build_decode_cache_handoff() -> dict[str, object]:
    """An fp16 pool exported for handoff, written, and read back as static caches."""
    torch.manual_seed(0)
    pool = randomize_(ReplayCachePool(TINY_REPLAY_SPEC, 2, 4, ring_dtypes=ring_dtypes_for("amp_fp16")))
    exported = export_decode_cache(pool, torch.float16)
    buffer = io.BytesIO()
    save_numpy_checkpoint(exported, buffer)
    buffer.seek(0)
    return {
        "exported": exported,
        "caches": load_decode_cache(buffer, TINY_REPLAY_SPEC, torch.float16),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Convert a Composer Kimi Linear checkpoint to a Hugging Face-style one."
    )
    parser.add_argument("--composer_path", required=True, help="Composer checkpoint (.pt)")
    parser.add_argument("--hf_output_path", required=True, help="output folder")
    parser.add_argument("--output_precision", default="bf16", choices=["fp32", "bf16", "fp16"])
    args = parser.parse_args(argv)
    dtype = dtype_from_str(args.output_precision)
    with dist.local_rank_zero_download_and_convert():
        composer_state = torch.load(args.composer_path, map_location="cpu", weights_only=False)
    if dist.get_global_rank() != 0:
        return
    output = Path(args.hf_output_path)
    output.mkdir(parents=True, exist_ok=True)
    save_numpy_checkpoint(convert_composer_to_hf(composer_state, dtype), output / "model.npz")
    metadata = composer_state.get("state", {}).get("integrations", {}).get("huggingface", {})
    config = dict(metadata.get("model", {}).get("config", {}))
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (output / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
