from .autoquant import autoquant
from .quant_api import (
    AOBaseConfig,
    Float16ReplayCacheConfig,
    Int8WeightOnlyConfig,
    MixedPrecisionConfig,
    ReplayCacheConfig,
    quantize_,
)
