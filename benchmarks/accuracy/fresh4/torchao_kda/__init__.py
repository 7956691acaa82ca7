from torchao_kda import ops, utils  # noqa: F401
from torchao_kda.quantization import autoquant, quantize_  # noqa: F401

__version__ = "0.11.0+kda"

__all__ = ["ops", "utils", "autoquant", "quantize_"]
