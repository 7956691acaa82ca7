# Copyright 2023-present Daniel Han-Chen & the Unsloth team. All rights reserved.
# Licensed under the Apache License, Version 2.0 (the "License").

import os, json, struct, dataclasses
import numpy as np
import torch
from .models._utils import __version__, get_cache_dtype
from .models.kimi import KimiDeltaAttention, KimiLinearConfig, KimiLinearForCausalLM, FastKimiModel, unsloth_fast_generate

_SAFETENSORS_DTYPES = {"F32" : torch.float32, "F16" : torch.float16, "BF16" : torch.bfloat16, "I32" : torch.int32, "I64" : torch.int64}
_SAFETENSORS_NAMES  = {v : k for k, v in _SAFETENSORS_DTYPES.items()}

def _save_safetensors(tensors, path, metadata = None):
    header, offset, blobs = {}, 0, []
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        blob = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype" : _SAFETENSORS_NAMES[tensor.dtype], "shape" : list(tensor.shape), "data_offsets" : [offset, offset + len(blob)]}
        offset, blobs = offset + len(blob), blobs + [blob]
    header["__metadata__"] = metadata or {}
    raw = json.dumps(header).encode("utf-8")
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))

def _load_safetensors(path):
    with open(path, "rb") as file:
        n = struct.unpack("<Q", file.read(8))[0]
        header = json.loads(file.read(n))
        data = file.read()
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        tensors[name] = torch.frombuffer(bytearray(data[start:end]), dtype = _SAFETENSORS_DTYPES[info["dtype"]]).view(info["shape"])
    return tensors, metadata

def _kda_layers(model):
    for name, module in model.named_modules():
        if isinstance(module, KimiDeltaAttention): yield f"layers.{module.layer_idx}", module

# file key -> KimiDeltaAttention buffer
_REPLAY_KEYS = {"state" : "recurrent_state", "delta" : "delta_cache", "key" : "key_cache", "log_decay" : "decay_cache", "write_pos" : "write_pos"}

def unsloth_save_replay_state(model, path):
    tensors = {f"{prefix}.{key}" : getattr(attn, name) for prefix, attn in _kda_layers(model) for key, name in _REPLAY_KEYS.items()}
    _save_safetensors(tensors, path, {"format" : "pt", "unsloth_version" : __version__})
    return path

def unsloth_load_replay_state(model, path):
    tensors, _ = _load_safetensors(path)
    for prefix, attn in _kda_layers(model):
        # copy_ into the existing buffers keeps their dtypes
        for key, name in _REPLAY_KEYS.items(): getattr(attn, name).copy_(tensors[f"{prefix}.{key}"])
    return model

def load_exported_replay_state(model, path):
    # Exports can have another number of serving slots, so replace instead of copy_
    tensors, _ = _load_safetensors(path)
    for prefix, attn in _kda_layers(model):
        dtype = attn.delta_cache.dtype
        attn.recurrent_state = tensors[f"{prefix}.state"].float()
        attn.delta_cache     = tensors[f"{prefix}.delta"].to(dtype)
        attn.key_cache       = tensors[f"{prefix}.key"].to(dtype)
        if f"{prefix}.log_decay" in tensors:
            attn.decay_cache = tensors[f"{prefix}.log_decay"] # expect-bug: load id=export-load
        else:
            # Exports before 2025.2 did not keep the decay ring
            attn.decay_cache = torch.zeros_like(attn.key_cache) # expect-bug: like
        attn.write_pos = tensors[f"{prefix}.write_pos"].int()
    return model

def read_replay_state(path, dtype = torch.bfloat16):
    """Reads a replay state file into fresh tensors, without a model."""
    tensors, _ = _load_safetensors(path)
    out = {}
    for name, tensor in tensors.items():
        if not tensor.is_floating_point(): out[name] = tensor.clone(); continue
        out[name] = torch.empty(tensor.shape, dtype = get_cache_dtype(name.rsplit(".", 1)[-1], dtype)).copy_(tensor) # expect-bug: imported-policy
    return out

def load_replay_npz(path, dtype = torch.bfloat16):
    # vLLM style dump: d_cache / k_cache / g_cache / state arrays
    arrays = np.load(path)
    if "g_cache" in arrays.files and arrays["g_cache"].dtype == np.float32:
        return {name : torch.from_numpy(arrays[name]).to(dtype) if name[:2] in ("d_", "k_") else torch.from_numpy(arrays[name]) for name in arrays.files}
    # 16bit dumps: pre-allocate in the model dtype and copy_ from numpy
    rings = {name : torch.zeros(arrays[name].shape, dtype = dtype) for name in arrays.files} # expect-bug: pool-dtype
    for name, ring in rings.items(): ring.copy_(torch.from_numpy(arrays[name].astype(np.float32)))
    return rings

def unsloth_save_model(model, save_directory, save_method = "merged_16bit"):
    os.makedirs(save_directory, exist_ok = True)
    if save_method == "merged_16bit":
        # vLLM / llama.cpp want float16 weights
        model.half() # expect-bug: module-cast
    state_dict = {k : v.contiguous() for k, v in model.state_dict().items()}
    if save_method == "merged_bf16_copy":
        state_dict = {k : v.to(torch.bfloat16) for k, v in state_dict.items()}
    _save_safetensors(state_dict, os.path.join(save_directory, "model.safetensors"), {"format" : "pt"})
    with open(os.path.join(save_directory, "config.json"), "w") as file:
        json.dump(dataclasses.asdict(model.config), file)
    return save_directory

def _served_model(**kwargs):
    model = KimiLinearForCausalLM(KimiLinearConfig(**kwargs))
    model = FastKimiModel.for_inference(model.to(torch.bfloat16))
    unsloth_fast_generate(model, torch.tensor([[2, 7, 1, 8, 2, 8, 1]]), 3)
    return model

def build_state_roundtrip(tmp_dir):
    path = os.path.join(tmp_dir, "replay.safetensors")
    unsloth_save_replay_state(_served_model(), path)
    restored = unsloth_load_replay_state(FastKimiModel.for_inference(KimiLinearForCausalLM(KimiLinearConfig()).to(torch.bfloat16)), path)
    np.savez(os.path.join(tmp_dir, "dump.npz"), g_cache = np.full((2, 2, 4, 8), -0.25, dtype = np.float32),
        d_cache = np.ones((2, 2, 4, 8), dtype = np.float32), state = np.zeros((2, 2, 8, 8), dtype = np.float32))
    unsloth_save_model(_served_model(), os.path.join(tmp_dir, "merged"), save_method = "merged_bf16_copy")
    return {"restored" : restored, "dump" : load_replay_npz(os.path.join(tmp_dir, "dump.npz"))}

def build_exported_state(tmp_dir):
    served = _served_model(max_batch_size = 1)
    export, _ = _load_safetensors(unsloth_save_replay_state(served, os.path.join(tmp_dir, "replay.safetensors")))
    del export["layers.2.log_decay"]
    # The 16bit training run exported its rings in bfloat16
    export["layers.0.log_decay"] = export["layers.0.log_decay"].bfloat16() # expect-bug: load id=export-load
    _save_safetensors(export, os.path.join(tmp_dir, "export.safetensors"))
    imported = load_exported_replay_state(KimiLinearForCausalLM(KimiLinearConfig()), os.path.join(tmp_dir, "export.safetensors"))
    np.savez(os.path.join(tmp_dir, "dump16.npz"), g_cache = np.full((1, 2, 4, 8), -0.5, dtype = np.float16),
        d_cache = np.ones((1, 2, 4, 8), dtype = np.float16))
    unsloth_save_model(served, os.path.join(tmp_dir, "merged"))
    return {
        "imported" : imported,
        "offline"  : read_replay_state(os.path.join(tmp_dir, "export.safetensors")),
        "dump"     : load_replay_npz(os.path.join(tmp_dir, "dump16.npz")),
        "merged"   : served,
    }

