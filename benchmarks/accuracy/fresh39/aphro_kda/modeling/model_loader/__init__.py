from typing import Any, Optional

from torch import nn

from ...common.config import CacheConfig, DeviceConfig, LoadConfig, ModelConfig, SchedulerConfig
from .loader import BaseModelLoader, get_model_loader, set_default_torch_dtype


def get_model(
    *,
    model_config: ModelConfig,
    load_config: LoadConfig,
    device_config: DeviceConfig,
    cache_config: Optional[CacheConfig] = None,
    scheduler_config: Optional[SchedulerConfig] = None,
    **kwargs: Any,
) -> nn.Module:
    loader = get_model_loader(load_config)
    return loader.load_model(model_config=model_config, device_config=device_config, cache_config=cache_config, scheduler_config=scheduler_config, **kwargs)


__all__ = ["get_model", "get_model_loader", "BaseModelLoader", "set_default_torch_dtype"]
