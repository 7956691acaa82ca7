"""Engine configs. DeepSpeed builds these on pydantic; plain dataclasses do here."""

from dataclasses import dataclass, field

import torch

from .utils import to_torch_dtype


class DeepSpeedConfigModel:
    """Base of every config (a pydantic ``BaseModel`` in DeepSpeed)."""


@dataclass
class DeepSpeedReplayConfig(DeepSpeedConfigModel):
    """ReplaySSM decode settings of the v1 engine (one decode slot per batch row)."""

    ring_len: int = 4
    max_batch_size: int = 2
    gate_precision: str | None = None

    @property
    def gate_dtype(self) -> torch.dtype:
        """Storage dtype of the per-step log-decay ring."""
        if self.gate_precision is None:
            return torch.float16  # expect-bug: container id=ds-gate-dtype
        return to_torch_dtype(self.gate_precision)


@dataclass
class DeepSpeedInferenceConfig(DeepSpeedConfigModel):
    """Arguments of ``init_inference``."""

    dtype: torch.dtype = torch.float16
    replace_with_kernel_inject: bool = False
    max_out_tokens: int = 1024
    replay: DeepSpeedReplayConfig = field(default_factory=DeepSpeedReplayConfig)

    def __post_init__(self) -> None:
        self.dtype = to_torch_dtype(self.dtype)
        if isinstance(self.replay, dict):
            self.replay = DeepSpeedReplayConfig(**self.replay)


@dataclass
class DSStateManagerConfig(DeepSpeedConfigModel):
    """How many sequences the ragged state manager tracks, and how long their rings are."""

    max_tracked_sequences: int = 4
    max_ragged_batch_size: int = 4
    ring_len: int = 4


@dataclass
class RaggedInferenceEngineConfig(DeepSpeedConfigModel):
    dtype: torch.dtype = torch.float16
    enable_cuda_graph: bool = False
    state_manager: DSStateManagerConfig = field(default_factory=DSStateManagerConfig)
