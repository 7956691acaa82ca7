# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Built-in recipe configs (what ``tune run <recipe> --config <name>`` loads).

Values may interpolate others with ``${key}``; they are resolved when read.
"""

from typing import Any, Dict

_TINY_MODEL: Dict[str, Any] = {"_component_": "tt_kda.models.kimi_linear_tiny"}

# Decode-cache settings shared by the generation configs.
_REPLAY_CACHE: Dict[str, Any] = {
    "max_seq_len": 32,
    "decay_dtype": "${dtype}",  # expect-bug: imported-policy id=cache-decay-dtype
}

GENERATION_TINY: Dict[str, Any] = {
    "model": _TINY_MODEL,
    "checkpointer": None,
    "device": "cpu",
    "dtype": "bf16",
    "seed": 1234,
    "log_level": "WARNING",
    "batch_size": 2,
    "prompt_tokens": [[1, 5, 9, 3], [2, 7, 4, 8]],
    "max_new_tokens": 5,
    "temperature": 0.6,
    "top_k": 16,
    "cache": _REPLAY_CACHE,
    "prefix_cache": {"capacity": 4},
}

GENERATION_TINY_FP32_DECAY: Dict[str, Any] = {
    **GENERATION_TINY,
    "cache": {**_REPLAY_CACHE, "decay_dtype": "fp32"},
    "prefix_cache": None,
}

EXPORT_TINY: Dict[str, Any] = {
    "model": _TINY_MODEL,
    "device": "cpu",
    "dtype": "bf16",
    "seed": 7,
    "batch_size": 2,
    "max_seq_len": 16,
}
