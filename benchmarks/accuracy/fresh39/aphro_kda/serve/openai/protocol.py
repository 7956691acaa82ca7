"""Request/response types of the OpenAI-compatible API (subset), plus the state handoff."""
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

import torch

from ...common.utils import random_uuid
from ...modeling.sampler import SamplingParams


@dataclass
class CompletionRequest:
    model: str
    prompt: Union[str, List[int]]
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: Optional[int] = None
    stream: bool = False
    return_state: bool = False
    user: Optional[str] = None

    def to_sampling_params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, max_tokens=self.max_tokens, seed=self.seed)


@dataclass
class CompletionResponseChoice:
    index: int
    token_ids: List[int]
    text: str
    finish_reason: Optional[str] = None


@dataclass
class CompletionResponse:
    model: str
    choices: List[CompletionResponseChoice]
    id: str = field(default_factory=lambda: f"cmpl-{random_uuid()}")
    object: str = "text_completion"
    created: int = field(default_factory=lambda: int(time.time()))
    usage: Dict[str, int] = field(default_factory=dict)
    state: Optional["StateHandoff"] = None


@dataclass
class StateHandoff:
    """A sequence's cache block for continuing it on another replica."""

    request_id: str
    token_ids: List[int]
    write_pos: int
    layers: List[Dict[str, torch.Tensor]]
    meta: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ErrorResponse:
    message: str
    type: str = "invalid_request_error"
    code: int = 400
