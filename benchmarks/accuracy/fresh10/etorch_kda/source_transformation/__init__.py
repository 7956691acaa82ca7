"""Module swaps applied by ``LLMEdgeManager.source_transform`` before export."""

from .custom_kv_cache import (  # noqa: F401
    CustomReplayCache,
    QuantizedReplayCache,
    replace_kv_cache_with_custom_kv_cache,
    replace_kv_cache_with_quantized_kv_cache,
    replace_kv_cache_with_ring_kv_cache,
)
from .quantize import QUANT_RECIPES, QuantRecipe  # noqa: F401
