"""optimum-quanto style quantization of Kimi Delta Attention models: ``quantize``, ``Calibration``,
``freeze``, ``requantize``, and a ``QuantizedKDACache`` for the ReplaySSM rings of a decode."""

from .tensor import QTensor, qbf16, qfloat8, qfp16, qfp32, qint4, qint8, qtypes, quint8
from .quantize import freeze, quantization_map, quantize, requantize

__version__ = "0.2.1"
