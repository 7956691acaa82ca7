"""Names, file names and lookup tables shared by the tuners, the model and the serving helpers."""

from __future__ import annotations

import enum

import torch


class PeftType(str, enum.Enum):
    """The adapter methods this package implements."""

    LORA = "LORA"


class TaskType(str, enum.Enum):
    CAUSAL_LM = "CAUSAL_LM"


CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.bin"
SAFETENSORS_WEIGHTS_NAME = "adapter_model.safetensors"
REPLAY_CACHE_NAME = "replay_cache.bin"
REPLAY_CACHE_FORMAT = 2
"""Format 1 stored per-head scalar decays (``gate_ring [slots, HV, L]``); format 2 per-channel ones."""

# Default LoRA targets per model type (used when a config leaves ``target_modules`` unset).
TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING = {
    "kda": ["q_proj", "v_proj"],
}

# Buffers of one layer's replay cache, in the order the kernels take them.
KDA_RING_NAMES = ("delta_ring", "key_ring", "log_decay_ring")
MODEL_DTYPE_RING_NAMES = ("delta_ring", "key_ring")
"""The rings that follow the model dtype; the log-decay ring and the checkpoint stay float32."""
REPLAY_BUFFER_NAMES = ("recurrent_state", *KDA_RING_NAMES, "write_pos")

# Ring dtypes by serving precision (``ReplayCacheConfig(ring_dtype_preset=...)``).
REPLAY_RING_DTYPE_PRESETS = {
    "float32": {"delta_ring": torch.float32, "key_ring": torch.float32, "log_decay_ring": torch.float32},
    "bfloat16": {"delta_ring": torch.bfloat16, "key_ring": torch.bfloat16, "log_decay_ring": torch.float32},
    "float16": {"delta_ring": torch.float16, "key_ring": torch.float16, "log_decay_ring": torch.float16},  # expect-bug: container
}

DTYPE_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
}
