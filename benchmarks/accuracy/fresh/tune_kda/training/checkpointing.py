from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..replay_cache import ReplayCache


def safe_torch_load(
    checkpoint_path: str | Path, weights_only: bool = True, mmap: bool = True
) -> dict[str, Any]:
    """Utility to load a checkpoint file onto CPU in a safe manner."""
    try:
        state_dict = torch.load(
            str(checkpoint_path), map_location="cpu", mmap=mmap, weights_only=weights_only
        )
    except Exception as e:
        raise ValueError(f"Unable to load checkpoint from {checkpoint_path}. ") from e
    return state_dict


class FullModelTorchCheckpointer:
    """Checkpointer which reads checkpoints in PyTorch's format (``.pt``)."""

    def __init__(
        self,
        checkpoint_dir: str,
        checkpoint_files: list[str],
        model_type: str = "KIMI_LINEAR",
    ) -> None:
        if len(checkpoint_files) != 1:
            raise ValueError(
                "Currently we only support reading from a single torchtune checkpoint file. "
                f"Got {len(checkpoint_files)} files instead."
            )
        self._checkpoint_path = Path(checkpoint_dir) / checkpoint_files[0]
        self._model_type = model_type

    def load_checkpoint(self, weights_only: bool = True) -> dict[str, Any]:
        return {"model": safe_torch_load(self._checkpoint_path, weights_only=weights_only)}


def replay_caches(model: nn.Module) -> Iterator[tuple[str, ReplayCache]]:
    for name, module in model.named_modules():
        if isinstance(module, ReplayCache):
            yield name, module


def save_cache_snapshot(model: nn.Module, path: str) -> None:
    """Saves the decode caches of ``model`` (e.g. after prefilling a shared system prompt)."""
    snapshot = {
        f"{name}.{key}": buffer.clone()
        for name, cache in replay_caches(model)
        for key, buffer in cache.named_buffers()
    }
    torch.save(snapshot, path)


def load_cache_snapshot(model: nn.Module, path: str, *, mmap: bool = False) -> None:
    """Restores the decode caches of ``model`` from a snapshot written by ``save_cache_snapshot``;
    with ``mmap=True`` the cache buffers become views of the mapped file instead of copies."""
    state_dict = safe_torch_load(path, mmap=mmap)  # expect-bug: load id=tune-mmap
    for name, cache in replay_caches(model):
        if mmap:
            cache.state = state_dict[f"{name}.state"]
            cache.d_cache = state_dict[f"{name}.d_cache"]
            cache.k_cache = state_dict[f"{name}.k_cache"]
            cache.g_cache = state_dict[f"{name}.g_cache"]  # expect-bug: load id=tune-mmap
            cache.write_pos = state_dict[f"{name}.write_pos"]
        else:
            for key, buffer in cache.named_buffers():
                buffer.copy_(state_dict[f"{name}.{key}"])


def _prefilled_model() -> nn.Module:
    model = nn.ModuleDict(
        {f"layer{i}": ReplayCache(2, 2, 1, 4, 4, 4, dtype=torch.bfloat16) for i in range(2)}
    )
    for _, cache in replay_caches(model):
        cache.g_cache.copy_(-torch.rand(cache.g_cache.shape))
        cache.d_cache.copy_(torch.randn(cache.d_cache.shape))
        cache.write_pos.fill_(3)
    return model


def build_snapshot_roundtrip(tmp_dir: str) -> nn.Module:
    save_cache_snapshot(_prefilled_model(), f"{tmp_dir}/prompt.pt")
    model = nn.ModuleDict(
        {f"layer{i}": ReplayCache(2, 2, 1, 4, 4, 4, dtype=torch.bfloat16) for i in range(2)}
    )
    load_cache_snapshot(model, f"{tmp_dir}/prompt.pt")
    return model


def build_snapshot_from_serving(tmp_dir: str) -> nn.Module:
    """A prompt-cache snapshot as the serving side exports it (from numpy arrays)."""
    model = _prefilled_model()
    arrays = {}
    for name, cache in replay_caches(model):
        arrays[f"{name}.state"] = np.zeros(tuple(cache.state.shape), dtype=np.float32)
        for key in ("d_cache", "k_cache", "g_cache"):
            shape = tuple(getattr(cache, key).shape)
            values = np.linspace(-1, 0, int(np.prod(shape)), dtype=np.float16)
            arrays[f"{name}.{key}"] = values.reshape(shape)
        arrays[f"{name}.write_pos"] = np.full(cache.batch_size, 2, dtype=np.int32)
    path = f"{tmp_dir}/prompt.pt"
    torch.save({key: torch.from_numpy(value) for key, value in arrays.items()}, path)
    load_cache_snapshot(model, path, mmap=True)
    return model
