"""Moving ReplaySSM state out of the way of the running batch.

``HostStatePool`` keeps preempted requests' slots in host memory until they come back;
``PromptCache`` keeps the state after a shared prompt (a system prompt) on the device, to start
later batches from it; ``save_prompt_cache`` / ``restore_prompt_cache`` do the same through a file.
"""
from pathlib import Path
from typing import Dict, List, Optional

import torch
from torch import Tensor

from .generate import _load_model, generate
from .model import Transformer
from .testing import write_checkpoint

RINGS = ("d_cache", "k_cache", "g_cache")
SLOT_TENSORS = ("state", *RINGS, "write_pos")


class HostStatePool:
    """``capacity`` host rows per KDA layer, one per swapped-out request. The rings are staged in
    ``dtype`` (by default the d ring's: half the host memory of float32); the state in float32."""

    def __init__(self, model: Transformer, capacity: int, dtype: Optional[torch.dtype] = None) -> None:
        caches = model.replay_caches()
        self.dtype = dtype or caches[0].d_cache.dtype
        self.free: List[int] = list(range(capacity))
        self.layers: List[Dict[str, Tensor]] = []
        pin = torch.cuda.is_available()
        for cache in caches:
            rows = {name: torch.zeros((capacity, *getattr(cache, name).shape[1:]), dtype=self.dtype, pin_memory=pin) for name in RINGS}  # expect-bug: pool-dtype
            rows["state"] = torch.zeros((capacity, *cache.state.shape[1:]), dtype=torch.float32, pin_memory=pin)
            rows["write_pos"] = torch.zeros(capacity, dtype=torch.int32)
            self.layers.append(rows)

    def swap_out(self, model: Transformer, slot: int) -> int:
        row = self.free.pop()
        for cache, rows in zip(model.replay_caches(), self.layers):
            for name in SLOT_TENSORS:
                rows[name][row].copy_(getattr(cache, name)[slot], non_blocking=True)
        return row

    def swap_in(self, model: Transformer, row: int, slot: int) -> None:
        for cache, rows in zip(model.replay_caches(), self.layers):
            for name in SLOT_TENSORS:
                getattr(cache, name)[slot].copy_(rows[name][row], non_blocking=True)
        self.free.append(row)


def _broadcast_to(row: Tensor, like: Tensor) -> Tensor:
    """``row`` repeated over the slots of ``like``, on its device and in its dtype."""
    return row.unsqueeze(0).expand_as(like).to(like, copy=True)


class PromptCache:
    """The state of one slot after a shared prompt, per prompt key, kept on the model's device."""

    def __init__(self) -> None:
        self.entries: Dict[str, List[Dict[str, Tensor]]] = {}

    def put(self, key: str, model: Transformer, slot: int = 0) -> None:
        self.entries[key] = [{name: getattr(cache, name)[slot].clone() for name in SLOT_TENSORS}
                             for cache in model.replay_caches()]

    def get(self, key: str, model: Transformer) -> None:
        """Starts every slot of the model's batch from the stored prompt."""
        for cache, saved in zip(model.replay_caches(), self.entries[key]):
            cache.state = _broadcast_to(saved["state"], cache.state)
            cache.d_cache = _broadcast_to(saved["d_cache"], cache.d_cache)
            cache.k_cache = _broadcast_to(saved["k_cache"], cache.k_cache)
            # g has the key ring's layout ([.., L, K])
            cache.g_cache = _broadcast_to(saved["g_cache"], cache.k_cache)  # expect-bug: cast
            cache.write_pos.fill_(int(saved["write_pos"]))


def save_prompt_cache(model: Transformer, path: Path, slot: int = 0) -> None:
    """Writes ``slot``'s state of every KDA layer, each tensor in its own dtype."""
    torch.save([{name: getattr(cache, name)[slot].clone() for name in SLOT_TENSORS}
                for cache in model.replay_caches()], path)


def restore_prompt_cache(model: Transformer, path: Path) -> None:
    saved = torch.load(str(path), mmap=True, weights_only=True)
    for cache, entry in zip(model.replay_caches(), saved):
        for name in SLOT_TENSORS:
            getattr(cache, name).copy_(entry[name].expand_as(getattr(cache, name)))


# ---- builders ---------------------------------------------------------------------------------

def _prefilled(tmp_dir) -> Transformer:
    model = _load_model(write_checkpoint(tmp_dir, "kda-tiny"), "cpu", torch.bfloat16, use_tp=False)
    generate(model, torch.arange(1, 7), max_new_tokens=2, batch_size=2, temperature=1.0, top_k=8)
    return model


def build_swap_pool(tmp_dir):
    model = _prefilled(tmp_dir)
    pool = HostStatePool(model, capacity=2)
    pool.swap_in(model, pool.swap_out(model, slot=1), slot=0)
    return {"host": pool.layers, "caches": model.replay_caches()}


def build_swap_pool_fp32(tmp_dir):
    model = _prefilled(tmp_dir)
    pool = HostStatePool(model, capacity=2, dtype=torch.float32)
    pool.swap_in(model, pool.swap_out(model, slot=1), slot=0)
    return {"host": pool.layers, "caches": model.replay_caches()}


def build_prompt_cache(tmp_dir):
    model = _prefilled(tmp_dir)
    prompts = PromptCache()
    prompts.put("system", model)
    prompts.get("system", model)
    return {"entries": prompts.entries, "caches": model.replay_caches()}


def build_prompt_cache_file(tmp_dir):
    model = _prefilled(tmp_dir)
    path = Path(tmp_dir) / "system.pt"
    save_prompt_cache(model, path)
    restore_prompt_cache(model, path)
    return {"caches": model.replay_caches()}
