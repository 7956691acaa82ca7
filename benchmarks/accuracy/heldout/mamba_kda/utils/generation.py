"""Generation state shared by the layers (mamba_ssm's InferenceParams)."""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class InferenceParams:
    max_seqlen: int
    max_batch_size: int
    seqlen_offset: int = 0
    key_value_memory_dict: dict[int, Any] = field(default_factory=dict)


def empty_state(shape: tuple[int, ...], template: Any) -> Any:
    """A zeroed tensor laid out like ``template`` (same dtype and device)."""
    return template.new_empty(shape).zero_()
