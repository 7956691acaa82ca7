"""ReplaySSM decode for Kimi Delta Attention layers, with a FlashInfer-shaped Python API."""

from .decode import BatchKDADecodeWithReplayRingWrapper, CUDAGraphBatchKDADecodeWrapper
from .page import ReplayRingPool, RingShape
