"""Job configuration: dataclass sections filled from a parsed TOML file."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

TORCH_DTYPE_MAP = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Model:
    name: str = "kda"
    flavor: str = "debugmodel"
    init_dtype: str = "float32"  # dtype the model is materialised in before parallelisation
    converters: list[str] = field(default_factory=list)


@dataclass
class Training:
    mixed_precision_param: str = "bfloat16"
    mixed_precision_reduce: str = "float32"


@dataclass
class Float8:
    filter_fqns: list[str] = field(default_factory=lambda: ["output"])


@dataclass
class Checkpoint:
    enable_checkpoint: bool = True
    folder: str = "checkpoint"
    export_dtype: str = "float32"  # dtype of the final (last_step) export


@dataclass
class Generation:
    max_new_tokens: int = 3
    dtype: str = "bfloat16"


@dataclass
class JobConfig:
    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    float8: Float8 = field(default_factory=Float8)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    generation: Generation = field(default_factory=Generation)

    @classmethod
    def from_dict(cls, toml: dict[str, Any]) -> JobConfig:
        sections = {}
        for section in fields(cls):
            values, kls = dict(toml.get(section.name, {})), section.default_factory  # type: ignore[misc]
            if unknown := set(values) - {f.name for f in fields(kls)}:
                raise ValueError(f"[{section.name}] has unknown keys {sorted(unknown)}")
            sections[section.name] = kls(**values)
        return cls(**sections)
