from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import List, Optional

import torch


@dataclass
class Request:
    """A request as the router sends it: prompt token ids and the cache slot it was given."""

    id: int
    input_ids: List[int]
    slot: int
    max_new_tokens: int = 8
    adapter_id: Optional[str] = None


@dataclass
class PbBatch:
    id: int
    requests: List[Request]

    @property
    def size(self) -> int:
        return len(self.requests)


class Batch(ABC):
    @classmethod
    @abstractmethod
    def from_pb(
        cls,
        pb: PbBatch,
        tokenizer,
        dtype: torch.dtype,
        device: torch.device,
    ) -> "Batch":
        raise NotImplementedError

    @abstractmethod
    def filter(self, request_ids: List[int]) -> "Batch":
        raise NotImplementedError

    @classmethod
    @abstractmethod
    def concatenate(cls, batches: List["Batch"]) -> "Batch":
        raise NotImplementedError

    @abstractmethod
    def __len__(self):
        raise NotImplementedError


@dataclass
class GeneratedText:
    token_ids: List[int]
    generated_tokens: int
    finish_reason: str


@dataclass
class Generation:
    request_id: int
    token_id: int
    generated_text: Optional[GeneratedText] = None
    speculative_ids: List[int] = field(default_factory=list)
