"""Generation state shared by the layers (mamba_ssm's InferenceParams)."""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class InferenceParams:
    max_seqlen: int
    max_batch_size: int
    seqlen_offset: int = 0
    key_value_memory_dict: dict[int, Any] = field(default_factory=dict)
