# Copyright (c) OpenMMLab. All rights reserved.
"""PyTorch engine pieces for Kimi Linear (KDA) models decoded with ReplaySSM caches."""
from .config import BackendConfig, CacheConfig, ModelConfig, SpecDecodeConfig

__version__ = '0.1.0'

__all__ = ['BackendConfig', 'CacheConfig', 'ModelConfig', 'SpecDecodeConfig']
