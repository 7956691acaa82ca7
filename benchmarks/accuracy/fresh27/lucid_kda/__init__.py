""" Kimi Delta Attention with ReplaySSM ring caches, in Pytorch """

from .cache import RingCache, RingSpec, init_ring_cache
from .kda import KimiDeltaAttention, RingState, FP32RingState
from .transformer import KimiLinear
from .trainer import EMA, Trainer
