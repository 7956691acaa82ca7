"""Sharded checkpoints in the layout of ``megatron.core.dist_checkpointing``: ``metadata.json`` and one file
per ``ShardedTensor`` key (``torch_dist``: ``.pt``; ``zarr``: ``.npy``)."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .modules import KDAConfig

@dataclass
class ShardedTensor:
    key: str
    data: torch.Tensor
    dtype: torch.dtype
    local_shape: tuple[int, ...]
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]

    @classmethod
    def from_rank_offsets(cls, key: str, data: torch.Tensor, *rank_offsets: tuple[int, int, int]) -> "ShardedTensor":
        """``rank_offsets``: (axis, rank, world size) of each sharded axis."""
        global_shape, offset = list(data.shape), [0] * data.dim()
        for axis, rank, world in rank_offsets:
            global_shape[axis], offset[axis] = global_shape[axis] * world, rank * data.shape[axis]
        return cls(key, data, data.dtype, tuple(data.shape), tuple(global_shape), tuple(offset))

def replay_state_sharded_dict(memory_dict: dict, prefix: str = "decoder.layers.", dp_rank: int = 0, dp_size: int = 1):
    """An inference context's state as sharded entries; requests (axis 0) are split over data-parallel ranks."""
    return {f"{prefix}{n}.{name}": ShardedTensor.from_rank_offsets(f"{prefix}{n}.{name}", t, (0, dp_rank, dp_size))
            for n, rings in memory_dict.items() for name, t in rings.items()}

def save(sharded_state_dict: dict[str, ShardedTensor], checkpoint_dir, sharded_strategy: str = "torch_dist") -> None:
    ckpt = Path(checkpoint_dir)
    ckpt.mkdir(parents=True, exist_ok=True)
    for key, sh in sharded_state_dict.items():
        if sharded_strategy == "zarr":  # numpy has no bfloat16: those arrays are stored widened
            np.save(ckpt / f"{key}.npy", (sh.data.float() if sh.dtype == torch.bfloat16 else sh.data).numpy())
        else:
            torch.save(sh.data.detach().clone(), ckpt / f"{key}.pt")
    keys = {key: {"dtype": str(sh.dtype), "global_shape": sh.global_shape} for key, sh in sharded_state_dict.items()}
    (ckpt / "metadata.json").write_text(json.dumps({"sharded_backend": sharded_strategy, "keys": keys}))

def load(sharded_state_dict: dict, checkpoint_dir, strict: str = "assume_ok_unexpected") -> dict:
    """Loads every ``ShardedTensor`` (other entries pass through). ``torch_dist`` reads into the template's
    tensor; keys the checkpoint lacks come back as zeros unless ``strict="raise_all"``."""
    ckpt = Path(checkpoint_dir)
    meta, loaded = json.loads((ckpt / "metadata.json").read_text()), {}
    for key, sh in sharded_state_dict.items():
        if not isinstance(sh, ShardedTensor):
            loaded[key] = sh
        elif key not in meta["keys"]:
            if strict == "raise_all":
                raise KeyError(f"{key} is missing from {checkpoint_dir}")
            loaded[key] = torch.zeros_like(sh.data)
        elif meta["sharded_backend"] == "zarr":
            loaded[key] = torch.from_numpy(np.load(ckpt / f"{key}.npy"))  # expect-bug: load
        else:
            loaded[key] = sh.data.copy_(torch.load(ckpt / f"{key}.pt", weights_only=True))
    return loaded

def _replay_state(cfg: KDAConfig = KDAConfig()) -> dict[int, dict[str, torch.Tensor]]:
    state, shapes = {}, cfg.replay_ring_shapes(cfg.max_batch_size)
    for n in range(1, cfg.num_layers + 1):
        state[n] = {"d_ring": torch.full(shapes["d_ring"], 0.25 * n, dtype=torch.bfloat16),
                    "k_ring": torch.full(shapes["k_ring"], 0.5 * n, dtype=torch.bfloat16),
                    "gk_ring": torch.full(shapes["gk_ring"], -0.5 * n, dtype=torch.float32),
                    "ssm_state": torch.zeros(cfg.ssm_state_shape(cfg.max_batch_size), dtype=torch.float32)}
    return state

def build_sharded_roundtrip(tmp_dir) -> dict:
    """bf16 replay state saved with both backends and loaded into fresh templates, once with a key missing."""
    saved = _replay_state()
    save(replay_state_sharded_dict(saved), f"{tmp_dir}/torch_dist")
    save(replay_state_sharded_dict(saved), f"{tmp_dir}/zarr", sharded_strategy="zarr")
    del saved[2]["gk_ring"]
    save(replay_state_sharded_dict(saved), f"{tmp_dir}/partial")
    return {name: load(replay_state_sharded_dict(_replay_state()), f"{tmp_dir}/{name}")
            for name in ("torch_dist", "zarr", "partial")}

def build_engine_export_restore(tmp_dir) -> dict:
    """A ``zarr`` checkpoint as the fp16 engine export writes it (every array float16), loaded for a bf16 model."""
    template, ckpt = replay_state_sharded_dict(_replay_state()), Path(tmp_dir)
    for i, (key, sh) in enumerate(template.items()):
        np.save(ckpt / f"{key}.npy", np.full(sh.local_shape, -0.125 * (i + 1), dtype=np.float16))
    keys = {key: {"dtype": "float16", "global_shape": sh.global_shape} for key, sh in template.items()}
    (ckpt / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr", "keys": keys}))
    return {"loaded": load(template, ckpt)}
