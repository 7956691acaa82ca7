"""What each model loader accepts: its UI options, its samplers, and how it stores the rings.

The Model tab shows only the options of the selected loader (``loaders_and_params``); the
Parameters tab hides the samplers a loader does not implement (``loaders_samplers``).
"""

import functools
from collections import OrderedDict
from typing import Dict, List

import torch

from tgw_kda.modules import utils

loaders_and_params: "OrderedDict[str, List[str]]" = OrderedDict(
    {
        "Transformers": [
            "cpu",
            "bf16",
            "load_in_8bit",
            "compute_dtype",
            "max_slots",
            "ring_len",
            "trust_remote_code",
        ],
        "ExLlamaKDA": [
            "max_slots",
            "ring_len",
            "cache_8bit",
            "bf16",
        ],
        "ExLlamaKDA_HF": [
            "ring_len",
            "bf16",
            "cfg_cache",
            "trust_remote_code",
        ],
        "KDA_HF": [
            "cpu",
            "bf16",
            "max_slots",
            "ring_len",
            "trust_remote_code",
        ],
    }
)


def transformers_samplers() -> List[str]:
    return [
        "temperature",
        "top_p",
        "min_p",
        "top_k",
        "typical_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "do_sample",
        "ban_eos_token",
        "add_bos_token",
        "custom_stopping_strings",
        "skip_special_tokens",
        "auto_max_new_tokens",
    ]


loaders_samplers: Dict[str, List[str]] = {
    "Transformers": transformers_samplers(),
    "ExLlamaKDA_HF": transformers_samplers(),
    "KDA_HF": transformers_samplers(),
    "ExLlamaKDA": [
        "temperature",
        "top_p",
        "min_p",
        "top_k",
        "repetition_penalty",
        "seed",
        "ban_eos_token",
        "add_bos_token",
        "custom_stopping_strings",
        "skip_special_tokens",
        "auto_max_new_tokens",
    ],
}

# Storage of the ReplaySSM rings per loader. "compute" follows the loader's compute dtype; the
# other entries are dtype names.
ring_storage: Dict[str, Dict[str, str]] = {
    "Transformers": {"state": "float32", "delta": "compute", "key": "compute", "log_decay": "float32"},
    "ExLlamaKDA": {"state": "float32", "delta": "compute", "key": "compute", "log_decay": "float32"},
    "ExLlamaKDA_HF": {"state": "float32", "delta": "compute", "key": "compute", "log_decay": "float32"},
    "KDA_HF": {"state": "float32", "delta": "compute", "key": "compute", "log_decay": "compute"},  # expect-bug: imported-policy id=hf-ring-storage
}


def get_ring_dtypes(loader: str, compute_dtype: torch.dtype) -> Dict[str, torch.dtype]:
    """The storage dtype of every ring kind for ``loader`` when it computes in ``compute_dtype``."""
    table = ring_storage.get(loader, ring_storage["Transformers"])
    return {
        kind: compute_dtype if name == "compute" else utils.str_to_torch_dtype(name)
        for kind, name in table.items()
    }


@functools.cache
def list_all_samplers() -> List[str]:
    all_samplers = set()
    for samplers in loaders_samplers.values():
        all_samplers.update(samplers)
    return sorted(all_samplers)


def get_all_params() -> List[str]:
    """Every option of every loader (the Model tab creates one element for each)."""
    all_params = set()
    for params in loaders_and_params.values():
        all_params.update(params)
    return sorted(all_params)


def make_loader_params_visible(loader: str) -> Dict[str, bool]:
    """Which options of the Model tab to show for ``loader``."""
    params = set(loaders_and_params.get(loader, []))
    return {name: name in params for name in get_all_params()}


def blacklist_samplers(loader: str) -> Dict[str, bool]:
    """Which samplers of the Parameters tab to show for ``loader``."""
    allowed = set(loaders_samplers.get(loader, list_all_samplers()))
    return {name: name in allowed for name in list_all_samplers()}
