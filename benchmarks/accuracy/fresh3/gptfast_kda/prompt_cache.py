# System-prompt cache for generate.py: the caches of a prefilled prompt are kept (in a host
# arena or on disk) and restored when the prompt comes back, skipping its prefill.
from pathlib import Path
from typing import Dict, Hashable

import torch

from .model import KDACache, Transformer
from .scripts.convert_hf_checkpoint import convert_hf_prompt_cache


def _cache_modules(model: Transformer) -> Dict[str, torch.nn.Module]:
    caches = {}
    for i, b in enumerate(model.layers):
        cache = b.attention.kda_cache if b.is_kda else b.attention.kv_cache
        if cache is not None:
            caches[f"layers.{i}"] = cache
    return caches


class HostPromptPool:
    """Preallocated host arena of ``num_entries`` prompt entries (pinned on CUDA machines), so
    storing a prompt is one device-to-host copy per cache and never an allocation."""

    def __init__(self, model: Transformer, num_entries: int, pin_memory: bool = False):
        dtype = model.output.weight.dtype
        caches = _cache_modules(model)
        shapes = {f"{p}.{n}": buf.shape[1:] for p, c in caches.items() for n, buf in c.named_buffers() if n not in ("state", "write_pos")}
        self.slots = {name: torch.zeros((num_entries, *shape), dtype=dtype, pin_memory=pin_memory) for name, shape in shapes.items()}  # expect-bug: pool-dtype
        # the checkpoints and the cursors keep their own dtypes
        for p, c in caches.items():
            if isinstance(c, KDACache):
                self.slots[f"{p}.state"] = torch.zeros((num_entries, *c.state.shape[1:]), dtype=torch.float32, pin_memory=pin_memory)
                self.slots[f"{p}.write_pos"] = torch.zeros(num_entries, dtype=torch.int32, pin_memory=pin_memory)
        self.num_entries = num_entries
        self.index: Dict[Hashable, int] = {}

    def _live(self, model: Transformer):
        for prefix, cache in _cache_modules(model).items():
            for name, buf in cache.named_buffers():
                yield f"{prefix}.{name}", buf

    def store(self, key: Hashable, model: Transformer, row: int = 0) -> int:
        slot = self.index.setdefault(key, len(self.index) % self.num_entries)
        for name, buf in self._live(model):
            self.slots[name][slot].copy_(buf[row], non_blocking=True)
        return slot


def _layer_state_dicts(state_dict: Dict[str, torch.Tensor], model: Transformer):
    for i, b in enumerate(model.layers):
        if b.is_kda and b.attention.kda_cache is not None:
            prefix = f"layers.{i}."
            yield b.attention.kda_cache, {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}


def save_prompt_cache(model: Transformer, path: Path) -> None:
    """Writes the KDA caches of every slot (what ``load_prompt_cache`` reads)."""
    torch.save({f"layers.{i}.{n}": buf for i, b in enumerate(model.layers) if b.is_kda for n, buf in b.attention.kda_cache.named_buffers()}, path)


def load_prompt_cache(model: Transformer, path: Path) -> None:
    state_dict = torch.load(str(path), mmap=True, weights_only=True)
    for cache, cache_sd in _layer_state_dicts(state_dict, model):
        cache.load_state_dict(cache_sd, strict=False)


def load_hf_prompt_cache(model: Transformer, path: Path) -> None:
    """Loads a prompt cache converted by ``scripts/convert_hf_checkpoint.py``. The file is mapped,
    and its tensors become the cache buffers (no copy of a possibly large cache)."""
    state_dict = torch.load(str(path), mmap=True, weights_only=True)
    for cache, cache_sd in _layer_state_dicts(state_dict, model):
        cache.load_state_dict(cache_sd, strict=False, assign=True)  # expect-bug: load id=hf-cache


def _prefilled(prompt_len: int = 3, batch_size: int = 2) -> Transformer:
    model = Transformer.from_name("kda-tiny").to(dtype=torch.bfloat16)
    model.setup_caches(max_batch_size=batch_size, max_seq_length=16)
    with torch.no_grad():
        model(torch.randint(0, 96, (batch_size, prompt_len)), torch.arange(prompt_len))
    return model


def build_host_pool():
    model = _prefilled()
    pool = HostPromptPool(model, num_entries=2)
    pool.store("system", model, row=1)
    return {"model": model, "pool": pool.slots}


def build_saved_prompt_cache(tmp_dir):
    path = Path(tmp_dir) / "prompt_cache.pth"
    save_prompt_cache(_prefilled(), path)
    model = _prefilled(prompt_len=2)
    load_prompt_cache(model, path)
    return model


def build_hf_prompt_cache(tmp_dir):
    model = _prefilled(prompt_len=2)
    # what transformers dumps for the model: rings in the model dtype, fp32 recurrent state
    hf = {}
    for i, b in enumerate(model.layers):
        if b.is_kda:
            for hf_name, name in (("delta_ring", "d_cache"), ("key_ring", "k_cache"), ("log_gate_ring", "g_cache")):
                hf[f"model.layers.{i}.self_attn.{hf_name}"] = torch.randn(getattr(b.attention.kda_cache, name).shape, dtype=torch.bfloat16)
            hf[f"model.layers.{i}.self_attn.recurrent_state"] = torch.randn(b.attention.kda_cache.state.shape)
            hf[f"model.layers.{i}.self_attn.ring_pos"] = torch.full((2,), 3, dtype=torch.int32)
    torch.save(hf, Path(tmp_dir) / "hf_cache.pt")
    out = convert_hf_prompt_cache(Path(tmp_dir) / "hf_cache.pt", Path(tmp_dir) / "prompt_cache.pth")
    load_hf_prompt_cache(model, out)
    return model
