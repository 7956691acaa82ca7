import inspect
from abc import ABC, abstractmethod
from typing import List, Optional, Tuple, Type, TypeVar

import torch

from ..utils.speculate import get_speculate
from .types import Batch, Generation

B = TypeVar("B", bound=Batch)


class Model(ABC):
    def __init__(
        self,
        model_id: str,
        model: torch.nn.Module,
        tokenizer,
        requires_padding: bool,
        dtype: torch.dtype,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
        speculate: Optional[int] = None,
        support_chunking: bool = False,
    ):
        self.model_id = model_id
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.requires_padding = requires_padding
        self.dtype = dtype
        self.device = device
        self.rank = rank
        self.world_size = world_size
        self.support_chunking = support_chunking

        if speculate is None:
            speculate = get_speculate()
        self.speculate = speculate

        self.has_position_ids = (
            inspect.signature(model.forward).parameters.get("position_ids", None)
            is not None
        )

        self.check_initialized()

    @property
    def info(self) -> dict:
        if self.requires_padding and self.support_chunking:
            raise ValueError("Chunking is not supported with padded models")

        return {
            "requires_padding": self.requires_padding,
            "dtype": str(self.dtype),
            "device_type": self.device.type,
            "speculate": self.speculate,
            "support_chunking": self.support_chunking,
        }

    @property
    @abstractmethod
    def batch_type(self) -> Type[B]:
        raise NotImplementedError

    @abstractmethod
    def generate_token(
        self, batch: B
    ) -> Tuple[List[Generation], Optional[B], Tuple[int, int]]:
        raise NotImplementedError

    def warmup(
        self, batch: B, max_input_tokens: Optional[int] = None, max_total_tokens: Optional[int] = None
    ) -> Tuple[Optional[int], int, int]:
        self.generate_token(batch)
        total = sum(len(ids) for ids in getattr(batch, "all_input_ids", []))
        if max_total_tokens is None:
            max_total_tokens = total
        if max_input_tokens is None:
            max_input_tokens = max_total_tokens - 1
        return None, max_input_tokens, max_total_tokens

    def init_kv_cache(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} keeps no decode caches")

    def check_initialized(self):
        uninitialized_parameters = []
        for n, p in self.model.named_parameters():
            if p.data.device == torch.device("meta"):
                uninitialized_parameters.append(n)
        if uninitialized_parameters:
            raise RuntimeError(
                f"found uninitialized parameters in model {self.__class__.__name__}: {uninitialized_parameters}"
            )
