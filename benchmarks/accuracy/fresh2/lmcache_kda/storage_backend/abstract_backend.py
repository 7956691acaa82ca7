import abc
from typing import Optional

from ..utils import CacheEngineKey, ReplayStateChunk


class LMCBackendInterface(metaclass=abc.ABCMeta):
    @abc.abstractmethod
    def put(self, key: CacheEngineKey, chunk: ReplayStateChunk) -> None:
        """Store the ReplaySSM chunk of a prefix."""

    @abc.abstractmethod
    def contains(self, key: CacheEngineKey) -> bool:
        """Whether a chunk is stored under `key`."""

    @abc.abstractmethod
    def get(self, key: CacheEngineKey) -> Optional[ReplayStateChunk]:
        """Retrieve the chunk stored under `key`, None if absent."""
