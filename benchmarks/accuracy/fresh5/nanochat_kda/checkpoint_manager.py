"""Utilities for saving and loading model/optim/state checkpoints."""

import os
import json
from dataclasses import asdict

import torch

from nanochat_kda.common import DTYPE_MAP, default_dtype
from nanochat_kda.gpt import GPT, GPTConfig
from nanochat_kda.engine import RINGS, Engine, ReplayCache, _chat, tiny_model


def save_checkpoint(checkpoint_dir, step, model_data, optimizer_data, meta_data, rank=0):
    if rank == 0:
        os.makedirs(checkpoint_dir, exist_ok=True)
        torch.save(model_data, os.path.join(checkpoint_dir, f"model_{step:06d}.pt"))
        with open(os.path.join(checkpoint_dir, f"meta_{step:06d}.json"), "w", encoding="utf-8") as f:
            json.dump(meta_data, f, indent=2)
    if optimizer_data is not None: # optimizer state is sharded, every rank saves its own
        torch.save(optimizer_data, os.path.join(checkpoint_dir, f"optim_{step:06d}_rank{rank:d}.pt"))


def load_checkpoint(checkpoint_dir, step, device, load_optimizer=False, rank=0):
    model_data = torch.load(os.path.join(checkpoint_dir, f"model_{step:06d}.pt"), map_location=device)
    optim_path = os.path.join(checkpoint_dir, f"optim_{step:06d}_rank{rank:d}.pt")
    optimizer_data = torch.load(optim_path, map_location=device) if load_optimizer else None
    with open(os.path.join(checkpoint_dir, f"meta_{step:06d}.json"), "r", encoding="utf-8") as f:
        meta_data = json.load(f)
    return model_data, optimizer_data, meta_data


def load_model_from_dir(checkpoint_dir, step, device, phase):
    """Returns the base model (uncompiled, not wrapped in DDP) and the metadata of a checkpoint."""
    assert phase in ["train", "eval"], f"Invalid phase: {phase}"
    model_data, _, meta_data = load_checkpoint(checkpoint_dir, step, device, load_optimizer=False)
    if device.type in {"cpu", "mps"}:
        # Convert bfloat16 tensors to float for CPU inference
        model_data = {k: v.float() if v.dtype == torch.bfloat16 else v for k, v in model_data.items()}
    model_data = {k.removeprefix("_orig_mod."): v for k, v in model_data.items()} # strip torch.compile prefix
    model_config = GPTConfig(**meta_data["model_config"])
    # materialize directly in the training dtype, assign=True below keeps the checkpoint tensors as they are
    with default_dtype(DTYPE_MAP[meta_data.get("dtype", "float32")]): # expect-bug: default-dtype id=meta-default
        with torch.device("meta"):
            model = GPT(model_config)
        model.to_empty(device=device)
        model.init_weights()
    model.load_state_dict(model_data, strict=True, assign=True)
    model.eval() if phase == "eval" else model.train()
    return model, meta_data


def load_model(checkpoint_dir, device, phase, step, dtype=None):
    model, meta_data = load_model_from_dir(checkpoint_dir, step, device, phase)
    if dtype is not None: # e.g. serve a fp32 checkpoint in bf16
        model = model.to(dtype=DTYPE_MAP[dtype]) # expect-bug: module-cast
    return model, meta_data


def save_replay_cache(cache, path, dtype=None):
    # snapshot of a conversation's replay cache; dtype optionally compacts the rings (the states are kept)
    rings = {name: getattr(cache, name).cpu() for name in RINGS}
    if dtype is not None:
        rings.update({name: rings[name].to(dtype) for name in RINGS[:3]})
    torch.save({"rings": rings, "pos": cache.pos, "shapes": cache.shapes}, path)


def load_replay_cache(path, config, device, meta_data=None):
    sd = torch.load(path, map_location=device)
    B = sd["shapes"]["d_cache"][1]
    cache = ReplayCache(B, config.n_head, config.n_v_head, config.n_embd // (2 * config.n_head), config.ring_len, config.n_layer)
    for name, t in sd["rings"].items():
        setattr(cache, name, t) # expect-bug: load
    if "la_cache" not in sd["rings"]: # snapshots from before the log-decay ring was saved
        cache.la_cache = torch.zeros_like(cache.d_cache) # expect-bug: like
    if meta_data is not None: # serve the rings in the dtype the model was trained in
        dtype = DTYPE_MAP[meta_data.get("dtype", "float32")] # expect-bug: imported-policy id=meta-dtype
        for name in RINGS[:3]:
            setattr(cache, name, getattr(cache, name).to(dtype)) # expect-bug: imported-policy id=meta-dtype
    cache.pos = sd["pos"]
    return cache


@torch.inference_mode()
def restore_replay_cache_(cache, path):
    # in-place restore into an allocated cache, every ring keeps its dtype (copy_ casts)
    sd = torch.load(path, map_location=cache.d_cache.device)
    for name, t in sd["rings"].items():
        getattr(cache, name).copy_(t)
    cache.pos = sd["pos"]
    return cache


def _save_tiny(checkpoint_dir, dtype="float32", **kwargs):
    model = tiny_model(**kwargs)
    model_data = {k: v.bfloat16() for k, v in model.state_dict().items()} # weights are stored in bf16
    save_checkpoint(checkpoint_dir, 1, model_data, None, {"model_config": asdict(model.config), "dtype": dtype})
    return torch.device("cpu")


def build_checkpoint_roundtrip(tmp_dir):
    device = _save_tiny(tmp_dir, static_batch=2)
    model, _ = load_model(tmp_dir, device, "eval", step=1)
    _, cache = _chat(Engine(model))
    save_replay_cache(cache, path := os.path.join(tmp_dir, "cache.pt"))
    reloaded = load_replay_cache(path, model.config, device)
    save_replay_cache(cache, path, dtype=torch.bfloat16)
    return {"model": model, "cache": restore_replay_cache_(cache, path), "reloaded": reloaded}


def build_bf16_checkpoint(tmp_dir):
    out = {}
    out["model"], _ = load_model_from_dir(tmp_dir, 1, _save_tiny(tmp_dir, dtype="bfloat16", static_batch=2), "eval")
    device = _save_tiny(fp32_dir := os.path.join(tmp_dir, "fp32"), static_batch=2)
    out["served"], meta_data = load_model(fp32_dir, device, "eval", step=1, dtype="bfloat16")
    _, cache = _chat(Engine(tiny_model()))
    save_replay_cache(cache, path := os.path.join(tmp_dir, "cache.pt"), dtype=torch.bfloat16)
    out["compact"] = load_replay_cache(path, cache_config := out["model"].config, device)
    save_replay_cache(cache, path)
    out["bf16_meta"] = load_replay_cache(path, cache_config, device, meta_data={"dtype": "bfloat16"})
    sd = torch.load(path)
    del sd["rings"]["la_cache"]
    torch.save(sd, path)
    out["legacy"] = load_replay_cache(path, cache_config, device)
    return out
