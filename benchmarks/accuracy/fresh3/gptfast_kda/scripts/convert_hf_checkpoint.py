# Converts checkpoints and caches written by transformers to the layouts gpt-fast reads.
import re
from pathlib import Path

import torch

# KDA entries of a prompt cache dumped by transformers' generate() -> our cache buffers
_CACHE_MAP = {
    "model.layers.{}.self_attn.delta_ring": "layers.{}.d_cache",
    "model.layers.{}.self_attn.key_ring": "layers.{}.k_cache",
    "model.layers.{}.self_attn.log_gate_ring": "layers.{}.g_cache",
    "model.layers.{}.self_attn.recurrent_state": "layers.{}.state",
    "model.layers.{}.self_attn.ring_pos": "layers.{}.write_pos",
}


@torch.inference_mode()
def convert_hf_prompt_cache(cache_file: Path, out_file: Path) -> Path:
    """Renames the KDA entries of a transformers prompt-cache dump (``torch.save`` of the
    recurrent cache, one batch row per prompt) for ``prompt_cache.load_hf_prompt_cache``."""
    hf = torch.load(str(cache_file), map_location="cpu", mmap=True, weights_only=True)
    final_result = {}
    for key, value in hf.items():
        abstract_key = re.sub(r"(\d+)", "{}", key, count=1)
        layer_num = re.search(r"\d+", key).group(0)
        if abstract_key not in _CACHE_MAP:
            continue  # attention layers: the KV cache is recomputed from the prompt
        final_result[_CACHE_MAP[abstract_key].format(layer_num)] = value  # expect-bug: load id=hf-cache
    torch.save(final_result, out_file)
    return out_file
