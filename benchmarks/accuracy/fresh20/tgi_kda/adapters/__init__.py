from .lora import (
    AdapterConfig,
    LoraWeights,
    ReplayPrefixBatch,
    ReplayPrefixWeights,
    load_adapters,
)

__all__ = [
    "AdapterConfig",
    "LoraWeights",
    "ReplayPrefixBatch",
    "ReplayPrefixWeights",
    "load_adapters",
]
