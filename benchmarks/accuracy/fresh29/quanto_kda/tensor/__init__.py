from .qtype import CACHE_RING_QTYPES, qbf16, qfloat8, qfp16, qfp32, qint4, qint8, qtype, qtypes, quint8, to_qtype
from .qtensor import QTensor, absmax_scale, pack_e5m2, quantize, unpack_e5m2
