"""Adapter configurations and the replay-cache configuration used when serving."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, Optional, Tuple, Union

import torch

from .utils.constants import CONFIG_NAME, KDA_RING_NAMES, REPLAY_RING_DTYPE_PRESETS, PeftType, TaskType
from .utils.other import str_to_torch_dtype


@dataclass
class PeftConfigMixin:
    """Serialisation of adapter configs to and from ``adapter_config.json``."""

    peft_type: Optional[PeftType] = field(default=None, metadata={"help": "The type of PEFT model."})

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, set):
                out[key] = sorted(value)
            elif isinstance(value, (PeftType, TaskType)):
                out[key] = value.value
        return out

    def save_pretrained(self, save_directory: str) -> None:
        if os.path.isfile(save_directory):
            raise AssertionError(f"Provided path ({save_directory}) should be a directory, not a file")
        os.makedirs(save_directory, exist_ok=True)
        with open(os.path.join(save_directory, CONFIG_NAME), "w") as writer:
            writer.write(json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @staticmethod
    def from_json_file(path_json_file: str) -> Dict[str, Any]:
        with open(path_json_file) as file:
            return json.load(file)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, **kwargs: Any) -> "PeftConfigMixin":
        loaded = cls.from_json_file(os.path.join(pretrained_model_name_or_path, CONFIG_NAME))
        loaded.update(kwargs)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in loaded.items() if k in known})

    @classmethod
    def _get_peft_type(cls, model_id: str) -> str:
        return cls.from_json_file(os.path.join(model_id, CONFIG_NAME))["peft_type"]


@dataclass
class PeftConfig(PeftConfigMixin):
    """Fields common to every adapter method.

    ``replay_cache_dtype`` and ``compact_replay_cache`` set the replay rings a
    ``PeftModelForCausalLM`` allocates in ``enable_replay_cache``.
    """

    base_model_name_or_path: Optional[str] = field(default=None, metadata={"help": "The name of the base model to use."})
    revision: Optional[str] = field(default=None, metadata={"help": "The specific base model version to use."})
    task_type: Optional[Union[str, TaskType]] = field(default=TaskType.CAUSAL_LM, metadata={"help": "Model task type."})
    inference_mode: bool = field(default=False, metadata={"help": "Whether to use inference mode."})
    replay_cache_dtype: Optional[str] = field(
        default=None, metadata={"help": "dtype of the delta and key replay rings; the model dtype when unset."}
    )
    compact_replay_cache: bool = field(
        default=False,
        metadata={"help": "Keep every replay ring in the ring dtype, halving the ring memory of long-lived slots."},
    )

    def replay_ring_dtypes(self, model_dtype: torch.dtype) -> Dict[str, torch.dtype]:
        """The replay ring dtypes of a model served in ``model_dtype`` with this adapter."""
        ring_dtype = str_to_torch_dtype(self.replay_cache_dtype) or model_dtype
        gate_dtype = ring_dtype if self.compact_replay_cache else torch.float32  # expect-bug: imported-policy id=compact-rings
        return {"delta_ring": ring_dtype, "key_ring": ring_dtype, "log_decay_ring": gate_dtype}


@dataclass
class ReplayCacheConfig:
    """Replay cache of a serving pool (see ``peft_kda.serving``).

    Rings take ``cache_dtype`` (default: the model dtype) except those in ``fp32_buffers``;
    ``ring_dtype_preset`` picks a fixed set from ``REPLAY_RING_DTYPE_PRESETS`` instead.
    """

    num_slots: int = 4
    cache_dtype: Optional[str] = None
    ring_dtype_preset: Optional[str] = None
    fp32_buffers: Tuple[str, ...] = ("recurrent_state", "log_decay_ring")

    def __post_init__(self) -> None:
        if self.ring_dtype_preset is not None and self.ring_dtype_preset not in REPLAY_RING_DTYPE_PRESETS:
            raise ValueError(f"ring_dtype_preset must be one of {sorted(REPLAY_RING_DTYPE_PRESETS)}, got {self.ring_dtype_preset!r}")
        self.fp32_buffers = tuple(self.fp32_buffers)

    def ring_dtype(self, name: str, model_dtype: torch.dtype) -> torch.dtype:
        if self.ring_dtype_preset is not None:
            return REPLAY_RING_DTYPE_PRESETS[self.ring_dtype_preset][name]
        if name in self.fp32_buffers:
            return torch.float32
        return str_to_torch_dtype(self.cache_dtype) or model_dtype

    def ring_dtypes(self, model_dtype: torch.dtype) -> Dict[str, torch.dtype]:
        return {name: self.ring_dtype(name, model_dtype) for name in KDA_RING_NAMES}
